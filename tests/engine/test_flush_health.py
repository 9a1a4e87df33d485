"""The flush fault rules (engine.flush_health), table-driven and without a disk."""
from __future__ import annotations

import errno

import pytest

from engine.flush_health import LOW_SPACE_BYTES, FaultKind, FlushHealth, classify

MiB = 1 << 20


@pytest.mark.parametrize(
    ("error_number", "free", "kind"),
    [
        (errno.ENOSPC, None, FaultKind.NO_SPACE),
        (errno.ENOSPC, 100 * MiB, FaultKind.NO_SPACE),  # the errno says it, whatever statvfs says now
        (errno.EDQUOT, None, FaultKind.NO_SPACE),
        (errno.EIO, 0, FaultKind.NO_SPACE),  # LMDB's short write on a disk that just filled up
        (errno.EIO, LOW_SPACE_BYTES - 1, FaultKind.NO_SPACE),
        (errno.EIO, LOW_SPACE_BYTES, FaultKind.WRITE_ERROR),  # space left: a real I/O error
        (errno.EIO, None, FaultKind.WRITE_ERROR),
        (errno.EACCES, 0, FaultKind.WRITE_ERROR),
        (None, 0, FaultKind.WRITE_ERROR),
    ],
)
def test_classify(error_number: int | None, free: int | None, kind: FaultKind) -> None:
    assert classify(error_number, free) is kind


def test_backoff_doubles_from_the_first_delay_up_to_the_cap() -> None:
    health = FlushHealth(max_retry_s=2.0, first_retry_s=0.05)
    delays = []
    for i in range(9):
        health.failed(float(i), FaultKind.NO_SPACE, "full", {0: (1, 5)})
        delays.append(health.retry_delay())
    assert delays == [0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0, 2.0]
    health.succeeded(10.0, items=5, nbytes=50, still_queued=0)
    assert health.retry_delay() == 0.0
    health.failed(11.0, FaultKind.NO_SPACE, "full", {})
    assert health.retry_delay() == 0.05  # a new fault starts the backoff over


def test_backoff_never_overflows_after_very_many_failures() -> None:
    health = FlushHealth(max_retry_s=3.0, first_retry_s=0.05)
    for i in range(200):
        health.failed(float(i), FaultKind.WRITE_ERROR, "eio", {})
    assert health.retry_delay() == 3.0


# (events, the state changes reported): F = failed(no space), E = failed(write error), S = succeeded
@pytest.mark.parametrize(
    ("events", "changes"),
    [
        ("S", []),
        ("F", ["failing"]),
        ("FFFF", ["failing"]),  # one line per state change, never one per retry
        ("FFS", ["failing", "recovered"]),
        ("FFSS", ["failing", "recovered"]),
        ("FSF", ["failing", "recovered", "failing"]),
        ("FEE", ["failing", "failing"]),  # the kind of failure changed: say so once
        ("FEFS", ["failing", "failing", "failing", "recovered"]),
    ],
)
def test_state_changes_are_reported_once(events: str, changes: list[str]) -> None:
    health = FlushHealth(max_retry_s=1.0)
    seen = []
    for now, event in enumerate(events):
        if event == "S":
            change = health.succeeded(float(now), items=1, nbytes=1, still_queued=0)
            if change is not None:
                seen.append("recovered")
        else:
            kind = FaultKind.NO_SPACE if event == "F" else FaultKind.WRITE_ERROR
            if health.failed(float(now), kind, "why", {0: (1, 1)}) is not None:
                seen.append("failing")
        assert (health.fault is None) == (event == "S")
    assert seen == changes


def test_failing_and_recovered_messages_name_partitions_seqnos_duration_and_amount() -> None:
    health = FlushHealth(max_retry_s=2.0)
    failing = health.failed(100.0, FaultKind.NO_SPACE, "DiskError: mdb_txn_commit: No space left on device",
                            {3: (11, 40), 0: (5, 9)})
    assert failing is not None
    text = failing.message()
    assert "disk holding the data dir is full" in text and "No space left on device" in text
    assert "partition 0 seqnos 5..9, partition 3 seqnos 11..40" in text
    assert "up to 2 s" in text
    assert health.failed(101.0, FaultKind.NO_SPACE, "again", {}) is None
    assert health.fault is not None and health.fault.since == 100.0  # the fault keeps its start
    recovered = health.succeeded(112.5, items=1234, nbytes=56789, still_queued=7)
    assert recovered is not None
    assert (recovered.failed_for_s, recovered.failed_rounds) == (12.5, 2)
    text = recovered.message()
    assert "after 12.5 s and 2 failed round(s)" in text
    assert "1234 item(s), 56789 bytes" in text and "7 item(s) still queued" in text


def test_a_fault_that_changes_kind_keeps_its_start() -> None:
    health = FlushHealth(max_retry_s=2.0)
    health.failed(5.0, FaultKind.NO_SPACE, "full", {})
    health.failed(7.0, FaultKind.WRITE_ERROR, "eio", {})
    assert health.fault is not None
    assert (health.fault.kind, health.fault.since) == (FaultKind.WRITE_ERROR, 5.0)


def test_many_partitions_are_summarised() -> None:
    health = FlushHealth(max_retry_s=2.0)
    change = health.failed(0.0, FaultKind.NO_SPACE, "full", {p: (1, 2) for p in range(20)})
    assert change is not None and "and 12 more partition(s)" in change.message()
