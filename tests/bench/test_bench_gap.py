"""The gap bench's count of resumed moved partitions: only a write the new active acknowledged
shows a resumption (tables; no cluster)."""
from __future__ import annotations

import pytest

from bench.cluster_gap import first_new_delivery

KILL = 10.0


@pytest.mark.parametrize("deliveries, acked, expected", [
    # the dead node's last frames right after the kill, nothing acked since: not resumed
    ([(10.01, 90), (10.02, 91)], {90: 9.99, 91: 10.001}, None),
    # an ack read just after the kill is the dead node's last answer, not a new active's
    ([(10.01, 92)], {92: 10.02}, None),
    # the new active's first acknowledged write, delivered
    ([(10.01, 91), (12.6, 92)], {91: 10.0, 92: 12.59}, 12.6),
    # the same seqno on the new branch: its ack is the later one; the old delivery came before it
    ([(9.9, 88), (10.01, 89), (12.7, 88)], {88: 12.65, 89: 10.0}, 12.7),
    # a delivery read a little before the writer read its ack is still that write
    ([(12.58, 92)], {92: 12.6}, 12.58),
    # ... but one long before the ack is an old branch's seqno
    ([(10.01, 92)], {92: 12.6}, None),
])
def test_first_new_delivery(deliveries, acked, expected) -> None:
    assert first_new_delivery(deliveries, acked, KILL) == expected
