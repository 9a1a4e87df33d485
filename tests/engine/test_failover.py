"""Failover-log rules (engine.core.failover), table-driven against kv_engine's failover-table.cc."""
from __future__ import annotations

import pytest

from engine.core import failover
from engine.core.types import FailoverEntry as E


@pytest.mark.parametrize(
    ("log", "entry", "cap", "expected"),
    [
        ((), E(1, 0), 25, (E(1, 0),)),
        ((E(1, 0),), E(2, 10), 25, (E(2, 10), E(1, 0))),
        # a new entry below existing ones removes the diverged branch
        ((E(3, 50), E(2, 10), E(1, 0)), E(4, 20), 25, (E(4, 20), E(2, 10), E(1, 0))),
        ((E(3, 50), E(2, 10), E(1, 0)), E(4, 5), 25, (E(4, 5), E(1, 0))),
        ((E(3, 50), E(2, 10), E(1, 0)), E(4, 0), 25, (E(4, 0), E(1, 0))),
        # equal seqno keeps the older entry (it still covers up to that point)
        ((E(2, 10), E(1, 0)), E(3, 10), 25, (E(3, 10), E(2, 10), E(1, 0))),
        # cap drops the oldest
        ((E(3, 30), E(2, 20), E(1, 10)), E(4, 40), 3, (E(4, 40), E(3, 30), E(2, 20))),
        ((E(3, 30), E(2, 20), E(1, 10)), E(4, 40), 1, (E(4, 40),)),
    ],
)
def test_add_entry(log, entry, cap, expected) -> None:
    assert failover.add_entry(log, entry, cap) == expected


@pytest.mark.parametrize("entry", [E(0, 1), E(1 << 64, 1), E(1, -1)])
def test_add_entry_rejects_invalid(entry) -> None:
    with pytest.raises(ValueError):
        failover.add_entry((), entry, 25)


def test_add_entry_rejects_zero_cap() -> None:
    with pytest.raises(ValueError):
        failover.add_entry((), E(1, 0), 0)


def test_cap_of_25_keeps_newest() -> None:
    log: failover.FailoverLog = ()
    for i in range(1, 41):
        log = failover.add_entry(log, E(i, i * 10), 25)
    assert len(log) == 25
    assert log[0] == E(40, 400) and log[-1] == E(16, 160)


@pytest.mark.parametrize(
    ("log", "seqno", "expected"),
    [
        ((E(3, 50), E(2, 10), E(1, 0)), 20, (E(2, 10), E(1, 0))),
        ((E(3, 50), E(2, 10), E(1, 0)), 50, (E(3, 50), E(2, 10), E(1, 0))),
        ((E(3, 50),), 10, ()),
    ],
)
def test_prune_above(log, seqno, expected) -> None:
    assert failover.prune_above(log, seqno) == expected


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        # kv_engine's sanitizeFailoverTable, newest first: each bad entry is erased on its own,
        # a seqno is compared with the last entry *kept*, and every valid entry stays
        ((E(2, 10), E(1, 0)), (E(2, 10), E(1, 0))),
        ((E(2, 10), E(0, 5), E(1, 0)), (E(2, 10), E(1, 0))),  # uuid 0 is never valid
        ((E(0, 50), E(2, 10), E(1, 0)), (E(2, 10), E(1, 0))),  # a bad newest entry keeps the rest
        ((E(2, 10), E(1, 20)), (E(2, 10),)),  # seqnos must not ascend going older
        ((E(3, 10), E(2, 20), E(1, 5)), (E(3, 10), E(1, 5))),  # only the ascending one goes
        # compared with the last kept entry, not with the erased one before it
        ((E(4, 10), E(3, 30), E(2, 20), E(1, 0)), (E(4, 10), E(1, 0))),
        ((E(4, 10), E(0, 5), E(2, 8), E(1, 0)), (E(4, 10), E(2, 8), E(1, 0))),
        ((E(4, 10), E(0, 5), E(2, 12), E(1, 0)), (E(4, 10), E(1, 0))),
        ((E(3, 10), E(2, 10), E(1, 10)), (E(3, 10), E(2, 10), E(1, 10))),  # equal seqnos are valid
        ((E(0, 0), E(0, 0)), ()),
        ((E(0, 0),), ()),
        ((), ()),
    ],
)
def test_sanitise(log, expected) -> None:
    assert failover.sanitise(log) == expected


def test_decode_sanitises() -> None:
    raw = failover.encode((E(0, 50), E(2, 10), E(3, 20), E(1, 0)))
    assert failover.decode(raw) == (E(2, 10), E(1, 0))


def test_encode_decode_round_trip_and_truncation() -> None:
    log = (E((1 << 64) - 1, 99), E(7, 0))
    raw = failover.encode(log)
    assert len(raw) == 32
    assert failover.decode(raw) == log
    assert failover.decode(raw + b"\x01\x02") == log
    assert failover.decode(raw[:20]) == log[:1]


def test_new_uuid_is_nonzero_64_bit_and_unused() -> None:
    existing = [E(5, 0)]
    seen = {failover.new_uuid(existing) for _ in range(200)}
    assert all(0 < u < 1 << 64 and u != 5 for u in seen)
    assert len(seen) == 200
