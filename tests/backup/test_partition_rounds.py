"""``PartitionRounds``: which batches of a partition are written again and at which level, as
transcripts of what the writes met, each checked against the rule it names."""
from __future__ import annotations

from typing import Any

import pytest

from clients.backup.partition_rounds import Done, Fail, PartitionRounds, Route, Send, final_durability

A, B = "http://a", "http://b"


def replay(rounds: PartitionRounds, events: list[tuple[Any, ...]]) -> list[Any]:
    """Feed ``events`` (("ack", batch, route, disturbed[, branch after]) | ("refused", route,
    disturbed)) and return every step answered, the first one (``start``) included.  The
    partition's history branch reads 7 before each round and after its last batch unless the
    event gives the read after it (a new round then starts on that branch)."""
    steps: list[Any] = [rounds.start()]
    rounds.branch_before(7)
    for ev in events:
        if ev[0] == "ack":
            _, batch, route, disturbed, *after = ev
            branch = (after[0] if after else 7) if batch == rounds.batches - 1 else None
            steps.append(rounds.acked(batch, route, disturbed=disturbed, seqno=10 * (batch + 1), branch=branch))
            if isinstance(steps[-1], Send) and steps[-1].batch == 0:
                rounds.branch_before(after[0] if after and after[0] is not None else 7)
        else:
            _, route, disturbed = ev
            steps.append(rounds.refused(route, "504 durability-ambiguous: partition 3 seqno 30 on node b",
                                        disturbed=disturbed, seqno=30))
    return steps


def sends(steps: list[Any]) -> list[tuple[int, str, int]]:
    return [(s.batch, s.durability, s.round) for s in steps if isinstance(s, Send)]


@pytest.mark.parametrize("cluster, level", [(True, "persist_majority"), (False, "persist")])
def test_the_last_batch_alone_is_durable_the_rest_go_at_memory(cluster: bool, level: str) -> None:
    """The fast path: memory for the bulk, one durable barrier per partition that covers it."""
    steps = replay(PartitionRounds(3, 3, cluster=cluster),
                   [("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("ack", 2, Route(A), False)])
    assert sends(steps) == [(0, "memory", 1), (1, "memory", 1), (2, level, 1)]
    assert steps[-1] == Done(1) and final_durability(cluster) == level


# name, events after start, expected sends (batch, level, round), expected end
CASES: list[tuple[str, list[tuple[Any, ...]], list[tuple[int, str, int]], Any]] = [
    ("the active moved between two memory batches: the partition is written again from its first batch",
     [("ack", 0, Route(A), False), ("ack", 1, Route(B, 1), False), ("ack", 0, Route(B, 1), False),
      ("ack", 1, Route(B, 1), False), ("ack", 2, Route(B, 1), False)],
     [(0, "memory", 1), (1, "memory", 1), (0, "memory", 2), (1, "memory", 2), (2, "persist_majority", 2)],
     Done(2)),
    ("the active moved just before the final batch: its durable wait on the new active does not cover the old "
     "active's memory batches",
     [("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("ack", 2, Route(B, 1), False),
      ("ack", 0, Route(B, 1), False), ("ack", 1, Route(B, 1), False), ("ack", 2, Route(B, 1), False)],
     [(0, "memory", 1), (1, "memory", 1), (2, "persist_majority", 1), (0, "memory", 2), (1, "memory", 2),
      (2, "persist_majority", 2)],
     Done(2)),
    ("the map named another active and then the same one again (A, B, A): the epoch tells",
     [("ack", 0, Route(A, 0), False), ("ack", 1, Route(A, 2), False), ("ack", 0, Route(A, 2), False),
      ("ack", 1, Route(A, 2), False), ("ack", 2, Route(A, 2), False)],
     [(0, "memory", 1), (1, "memory", 1), (0, "memory", 2), (1, "memory", 2), (2, "persist_majority", 2)],
     Done(2)),
    ("a batch that met a lost node or a 421 on the way, even acknowledged by the same URL, is a redo",
     [("ack", 0, Route(A), False), ("ack", 1, Route(A), True), ("ack", 0, Route(A), False),
      ("ack", 1, Route(A), False), ("ack", 2, Route(A), False)],
     [(0, "memory", 1), (1, "memory", 1), (0, "memory", 2), (1, "memory", 2), (2, "persist_majority", 2)],
     Done(2)),
    ("a move met by the first batch costs nothing: nothing of the round was acknowledged before it",
     [("ack", 0, Route(B, 1), True), ("ack", 1, Route(B, 1), False), ("ack", 2, Route(B, 1), False)],
     [(0, "memory", 1), (1, "memory", 1), (2, "persist_majority", 1)],
     Done(1)),
    ("a crash restart the client never saw (same URL and epoch, no failed request): the history branched",
     [("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("ack", 2, Route(A), False, 8),
      ("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("ack", 2, Route(A), False, 8)],
     [(0, "memory", 1), (1, "memory", 1), (2, "persist_majority", 1), (0, "memory", 2), (1, "memory", 2),
      (2, "persist_majority", 2)],
     Done(2)),
    ("the history could not be read after the last batch: a branch cannot be ruled out",
     [("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("ack", 2, Route(A), False, None),
      ("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("ack", 2, Route(A), False)],
     [(0, "memory", 1), (1, "memory", 1), (2, "persist_majority", 1), (0, "memory", 2), (1, "memory", 2),
      (2, "persist_majority", 2)],
     Done(2)),
    ("a 504 on the final batch from the same undisturbed active: only the final batch is sent again",
     [("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("refused", Route(A), False),
      ("ack", 2, Route(A), False)],
     [(0, "memory", 1), (1, "memory", 1), (2, "persist_majority", 1), (2, "persist_majority", 1)],
     Done(1)),
    ("a 504 on the final batch from a new active: the partition is written again",
     [("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("refused", Route(B, 1), False),
      ("ack", 0, Route(B, 1), False), ("ack", 1, Route(B, 1), False), ("ack", 2, Route(B, 1), False)],
     [(0, "memory", 1), (1, "memory", 1), (2, "persist_majority", 1), (0, "memory", 2), (1, "memory", 2),
      (2, "persist_majority", 2)],
     Done(2)),
    ("a 504 after a lost node on the way to the final batch: written again",
     [("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("refused", Route(A), True),
      ("ack", 0, Route(A), False), ("ack", 1, Route(A), False), ("ack", 2, Route(A), False)],
     [(0, "memory", 1), (1, "memory", 1), (2, "persist_majority", 1), (0, "memory", 2), (1, "memory", 2),
      (2, "persist_majority", 2)],
     Done(2)),
]


@pytest.mark.parametrize("name, events, expected, end", CASES, ids=[c[0][:60] for c in CASES])
def test_which_batches_are_written_again(name: str, events: list[tuple[Any, ...]],
                                         expected: list[tuple[int, str, int]], end: Any) -> None:
    steps = replay(PartitionRounds(3, 3, cluster=True), events)
    assert sends(steps) == expected, name
    assert steps[-1] == end, name


def test_a_one_batch_partition_is_its_own_barrier_and_retries_a_refused_wait() -> None:
    rounds = PartitionRounds(0, 1, cluster=True)
    assert rounds.start() == Send(0, "persist_majority", 1)
    step = rounds.refused(Route(A), "504", seqno=7)
    assert isinstance(step, Send) and step.batch == 0 and step.delay_s > 0 and step.round == 1
    assert rounds.acked(0, Route(B, 1), disturbed=True) == Done(1)  # nothing earlier to cover


def test_a_final_wait_refused_too_often_fails_naming_partition_seqno_and_node() -> None:
    rounds = PartitionRounds(5, 2, cluster=True, max_final_retries=3)
    rounds.start()
    rounds.acked(0, Route(A))
    delays = []
    step: Any = None
    for _ in range(4):
        step = rounds.refused(Route(A), "HTTP 504: partition 5 seqno 41 on node n2: not persist_majority-durable",
                              seqno=41)
        if isinstance(step, Send):
            delays.append(step.delay_s)
    assert isinstance(step, Fail) and step.seqno == 41
    assert "partition 5, seqno 41, node http://a" in step.message and "not complete" in step.message
    assert "\n" not in step.message
    assert delays == sorted(delays) and len(delays) == 3  # bounded, backing off


def test_an_active_that_keeps_moving_fails_after_max_rounds_never_succeeds() -> None:
    rounds = PartitionRounds(2, 2, cluster=True, max_rounds=3)
    step: Any = rounds.start()
    rounds.branch_before(7)
    for epoch in range(10):
        step = rounds.acked(0, Route(A, 2 * epoch), seqno=1)
        step = rounds.acked(1, Route(A, 2 * epoch + 1), seqno=2)
        if isinstance(step, Fail):
            break
    assert isinstance(step, Fail) and rounds.round == 3
    assert "partition 2, seqno 2, node http://a" in step.message and len(rounds.redo_reasons) == 3


def test_a_single_node_crash_between_batches_is_a_redo_too() -> None:
    """One node restarted (no map, so no epoch): the connection failure the batch met says its
    earlier memory batches may be gone with the crash; the last ``persist`` must cover them again."""
    rounds = PartitionRounds(1, 2, cluster=False)
    rounds.start()
    rounds.acked(0, Route(A))
    assert rounds.acked(1, Route(A), disturbed=True) == Send(0, "memory", 2)


def test_a_partition_has_at_least_one_batch() -> None:
    with pytest.raises(ValueError):
        PartitionRounds(0, 0, cluster=True)
