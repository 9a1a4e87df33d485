"""A full disk under a running engine: typed outcome, backoff, backpressure, lossless recovery.

The data dir lives on a real 8 MiB tmpfs that the test fills with a file until ENOSPC, so LMDB's
commit fails as it does on a full disk in production; deleting the file gives the space back.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from engine.core.errors import Backpressure, InsufficientStorage
from engine.core.types import Op, WriteOp
from engine.engine import Engine
from engine.flush_health import FaultKind
from tests.support.small_fs import fill, small_tmpfs

BIG = 200 << 10  # values big enough that a flush needs pages LMDB has not allocated before
FLUSHER_LOG = "engine.flusher"


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    with small_tmpfs(tmp_path / "fs", 8) as where:
        yield where


@pytest.fixture
def open_engine(small_disk: Path, make_engine: Callable[..., Engine]) -> Callable[..., Engine]:
    """``make_engine`` (conftest) on the small disk; ``small_disk`` comes first so that the engines
    are closed before the filesystem goes away."""

    def open_(**overrides: object) -> Engine:
        settings: dict[str, object] = {
            "data_dir": small_disk / "data", "flush_retry_max_s": 0.2,
            "flush_failure_backlog_bytes": 1 << 20, "lmdb_map_size": 1 << 30,
        }
        return make_engine(**{**settings, **overrides})

    return open_


def value(i: int, size: int = BIG) -> bytes:
    return bytes([i % 251]) * size


def wait_until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def flusher_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == FLUSHER_LOG]


def test_full_disk_gives_typed_outcome_backs_off_refuses_backlog_and_recovers_losslessly(
        open_engine, small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=FLUSHER_LOG)
    engine = open_engine()
    acknowledged: dict[str, bytes] = {}
    for i in range(3):
        engine.write(WriteOp(Op.MUTATION, f"before{i}", value(i, 1000)))
        acknowledged[f"before{i}"] = value(i, 1000)
    engine.flush_now()
    filler = fill(small_disk)

    # a persist write: applied, queued, and told so with its partition and seqno
    r = engine.write(WriteOp(Op.MUTATION, "big0", value(0)))
    acknowledged["big0"] = value(0)
    with pytest.raises(InsufficientStorage) as failed:
        engine.persist_future({r.partition: r.seqno}).result(timeout=15)
    err = failed.value
    assert (err.partition, err.seqno, err.unpersisted) == (r.partition, r.seqno, {r.partition: r.seqno})
    assert "applied and queued in memory, but not persisted" in err.message
    assert "full" in err.message and "once space returns" in err.message
    assert engine.get("big0").value == value(0)  # the write happened
    fault = engine.flush_fault
    assert fault is not None and fault.kind is FaultKind.NO_SPACE
    assert engine.engine_stats()["flush_failing"] == 1.0

    # while the disk stays full, a persist waiter is answered at once, not after a backoff
    began = time.monotonic()
    with pytest.raises(InsufficientStorage):
        engine.persist_future({r.partition: r.seqno}).result(timeout=15)
    assert time.monotonic() - began < 5.0  # generous: the point is "no hang", not a latency figure

    # capped backoff: a handful of attempts per second, not one per 2 ms flush interval
    errors = engine.engine_stats()["flush_errors_total"]
    time.sleep(1.0)
    retries = engine.engine_stats()["flush_errors_total"] - errors
    assert retries <= 12, retries

    # memory writes are taken until the unpersisted backlog passes its bound, then refused
    refused = None
    for i in range(1, 40):
        try:
            engine.write(WriteOp(Op.MUTATION, f"big{i}", value(i)))
        except Backpressure as exc:
            refused = exc
            break
        acknowledged[f"big{i}"] = value(i)
    assert refused is not None, "memory writes were never refused while nothing could be persisted"
    assert "flushing to disk is failing" in refused.message and refused.retriable
    assert 4 <= len(acknowledged) - 3 <= 8  # about 1 MiB of 200 KiB values, then refused

    # one line for the state change, no traceback, however many retries happened
    failing = [rec for rec in flusher_records(caplog) if "is failing" in rec.getMessage()]
    assert len(failing) == 1, [rec.getMessage() for rec in flusher_records(caplog)]
    assert failing[0].exc_info is None
    assert f"partition {r.partition} seqnos" in failing[0].getMessage()
    assert "full" in failing[0].getMessage()

    # space returns: the flusher notices by itself and persists everything
    filler.unlink()
    wait_until(lambda: engine.flush_fault is None)
    engine.flush_now()
    assert all(engine.persisted_seqno(p) == engine.high_seqno(p) for p in range(4))
    assert engine.engine_stats()["flush_failing"] == 0.0
    # the flusher logs right after it clears the fault: wait for the line, do not race it
    wait_until(lambda: any("recovered" in rec.getMessage() for rec in flusher_records(caplog)))
    recovered = [rec for rec in flusher_records(caplog) if "recovered" in rec.getMessage()]
    assert len(recovered) == 1 and "failed round(s)" in recovered[0].getMessage()
    engine.write(WriteOp(Op.MUTATION, "after", b"a"))  # accepted again
    acknowledged["after"] = b"a"
    engine.flush_now()
    engine.close()
    assert engine.closed_clean

    again = open_engine()
    assert again.opened_clean
    for key, expected in acknowledged.items():
        assert again.get(key).value == expected, key


def test_close_on_a_full_disk_says_what_is_lost_instead_of_closing_cleanly(
        open_engine, small_disk: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    engine = open_engine()
    engine.write(WriteOp(Op.MUTATION, "kept", b"k"))
    engine.flush_now()
    filler = fill(small_disk)
    results = [engine.write(WriteOp(Op.MUTATION, f"lost{i}", value(i))) for i in range(3)]
    wait_until(lambda: engine.flush_fault is not None)
    engine.close()
    assert engine.closed_clean is False
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "engine.engine" and rec.levelno >= logging.ERROR]
    assert len(lines) == 1, lines
    line = lines[0]
    assert "unpersisted writes, which are lost" in line and "full" in line
    for r in results:
        assert f"partition {r.partition} seqnos" in line
    assert "3 item(s)" in line
    filler.unlink()
    again = open_engine()
    assert not again.opened_clean
    assert again.get("kept").value == b"k"


def test_a_commit_cut_short_by_the_disk_filling_up_counts_as_no_space(
        open_engine, small_disk: Path) -> None:
    """LMDB reports a ``pwrite`` cut short part-way (the disk filled during the commit) as EIO."""
    engine = open_engine()
    engine.write(WriteOp(Op.MUTATION, "first", b"f"))
    engine.flush_now()
    filler = fill(small_disk)
    os.truncate(filler, filler.stat().st_size - (96 << 10))  # room for part of the commit only
    r = engine.write(WriteOp(Op.MUTATION, "big", value(1, 1 << 20)))
    with pytest.raises(InsufficientStorage):
        engine.persist_future({r.partition: r.seqno}).result(timeout=15)
    fault = engine.flush_fault
    assert fault is not None and fault.kind is FaultKind.NO_SPACE, fault
    filler.unlink()
    wait_until(lambda: engine.flush_fault is None)
    engine.flush_now()
    assert engine.persisted_seqno(r.partition) == r.seqno
