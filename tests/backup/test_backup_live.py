"""The backup client against real ``upr server`` processes (slow: CI runs them all).

Each test checks the end state by reading every key it ever wrote from the source server at the
time of a run and from a fresh server after restoring that run: the two must be equal.
"""
from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from clients.backup.archive import Archive
from clients.backup.create import create_backup
from clients.backup.merge import merge
from clients.backup.restore import restore
from clients.backup.verify import verify
from tests.support.keys import keys_in
from tests.support.net import free_port

from .live import bulk, cli, cli_popen, del_op, read_state, set_op

pytestmark = pytest.mark.slow


def _random_round(rng: random.Random, keys: list[str], n: int, delete_ratio: float) -> list[dict]:
    ops = []
    for _ in range(n):
        k = rng.choice(keys)
        if rng.random() < delete_ratio:
            ops.append(del_op(k))
        else:
            ops.append(set_op(k, os.urandom(rng.randint(0, 40)) + b"v" * rng.randint(0, 300)))
    return ops


def test_full_and_incrementals_restore_the_source_as_of_each_run(upr_server: Callable, tmp_path: Path) -> None:
    src = upr_server(partitions=8, data_dir=tmp_path / "src")
    rng = random.Random(11)
    keys = [f"doc-{i}" for i in range(400)]
    archive_dir = tmp_path / "archive"
    expected: dict[str, dict[str, bytes | None]] = {}
    for round_no in range(4):
        bulk(src.url, _random_round(rng, keys, 600 if round_no == 0 else 150, 0.0 if round_no == 0 else 0.35))
        result = create_backup(archive_dir, src.url, idle_timeout=30)
        assert result.manifest.kind == ("full" if round_no == 0 else "incremental")
        expected[result.manifest.run_id] = read_state(src.url, keys)
    archive = Archive.open(archive_dir)
    runs = archive.runs()
    assert len(runs) == 4 and verify(archive).ok
    # an incremental holds only what changed: far fewer items than the full run
    assert runs[1].mutations + runs[1].deletions < runs[0].mutations
    assert runs[2].deletions > 0

    for n, run in enumerate([runs[1], runs[3]]):
        # restore into fresh servers, one of them with another partition count (keys are re-hashed)
        # and a bulk limit below our batch size (413: the restore halves its batches)
        dst = upr_server(partitions=8 if n == 0 else 4, data_dir=tmp_path / f"dst{n}",
                         args=[] if n == 0 else ["--max-bulk-items", "64"])
        report = restore(archive, dst.url, run_spec=run.run_id)
        assert report.deletes > 0
        assert read_state(dst.url, keys) == expected[run.run_id], f"restore of run {n} differs"
        # idempotent: a second restore changes nothing
        restore(archive, dst.url, run_spec=run.run_id)
        assert read_state(dst.url, keys) == expected[run.run_id]
        dst.kill()

    # a forced full run starts a new chain: recorded as a rollback to 0, earlier runs masked
    forced = create_backup(archive_dir, src.url, idle_timeout=30, full=True).manifest
    assert forced.kind == "full" and forced.mutations == sum(v is not None for v in expected[runs[3].run_id].values())
    assert all(r.start.seqno == 0 and r.rollbacks[0].reason == "full backup requested" for r in forced.partitions.values())
    assert verify(archive).ok
    dst = upr_server(partitions=8, data_dir=tmp_path / "dst-forced")
    restore(archive, dst.url)
    assert read_state(dst.url, keys) == expected[runs[3].run_id]
    dst.kill()

    merged = merge(archive, "1", "3")
    assert [r.run_id for r in archive.runs()] == [merged.run_id, runs[3].run_id, forced.run_id]
    assert verify(archive).ok
    dst = upr_server(partitions=8, data_dir=tmp_path / "dst-merged")
    restore(archive, dst.url, run_spec=runs[3].run_id, key_filter=r"^doc-1")
    want = {k: (v if k.startswith("doc-1") else None) for k, v in expected[runs[3].run_id].items()}
    assert read_state(dst.url, keys) == want


def _parts_committed(archive_dir: Path) -> int:
    return len(list(archive_dir.glob("runs/*/parts/p*.json")))


def _wait_for(cond: Callable[[], bool], proc, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"process ended before the condition held ({proc.returncode}): {err.decode()[-2000:]}")
        time.sleep(0.005)
    raise AssertionError("condition not reached in time")


def test_sigkilled_backup_and_restore_resume_where_they_stopped(upr_server: Callable, tmp_path: Path) -> None:
    parts = 4
    src = upr_server(partitions=parts, data_dir=tmp_path / "src")
    # partition 3 is big (streamed last to finish, restored last), the others small
    big = keys_in({3}, 2500, "big", total=parts)
    small = [k for p in range(3) for k in keys_in({p}, 100, "small", total=parts)]
    bulk(src.url, [set_op(k, os.urandom(12_000)) for k in big], chunk=200)
    bulk(src.url, [set_op(k, os.urandom(100)) for k in small])
    archive_dir = tmp_path / "archive"

    proc = cli_popen("create", "--archive", str(archive_dir), "--server", src.url)

    def big_partition_half_streamed() -> bool:
        seg = list(archive_dir.glob("runs/*/p0003.seg"))
        return _parts_committed(archive_dir) >= 1 and bool(seg) and seg[0].stat().st_size > 8_000_000

    _wait_for(big_partition_half_streamed, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    archive = Archive.open(archive_dir)
    assert archive.runs() == [] and len(archive.partial_runs()) == 1
    assert verify(archive).ok  # a killed run never makes the archive invalid
    committed = _parts_committed(archive_dir)
    assert 1 <= committed < parts

    result = create_backup(archive_dir, src.url, idle_timeout=30)
    assert result.resumed and result.partitions_reused == committed
    assert result.partitions_taken == parts - committed
    # the big partition continued from the last checkpoint the killed run had written, not from 0
    assert result.resumed_at.get(3, 0) > 0, result.resumed_at
    assert result.manifest.resumed == 1 and verify(archive).ok
    source = read_state(src.url, big + small)

    dst = upr_server(partitions=parts, data_dir=tmp_path / "dst")
    journal_dir = archive_dir / "restores"
    proc = cli_popen("restore", "--archive", str(archive_dir), "--server", dst.url, "--batch", "50")

    def journaled() -> bool:
        files = list(journal_dir.glob("*.json")) if journal_dir.exists() else []
        return any(len(json.loads(f.read_bytes()).get("done", [])) >= 1 for f in files)

    _wait_for(journaled, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    report = restore(archive, dst.url)
    assert report.skipped and 3 not in report.skipped  # the big partition was cut short and redone
    assert read_state(dst.url, big + small) == source
    assert not list(journal_dir.glob("*.json"))  # a finished restore leaves no journal


def test_server_crash_between_runs_forces_a_narrow_rollback(upr_server: Callable, tmp_path: Path) -> None:
    parts = 4
    data = tmp_path / "src"
    # memory writes stay unpersisted for a minute: a SIGKILL loses them
    src = upr_server(partitions=parts, data_dir=data, args=["--flush-interval-ms", "60000"])
    keys = [f"key-{i}" for i in range(200)]
    bulk(src.url, [set_op(k, b"A-" + k.encode()) for k in keys], durability="persist")
    lost_keys = [k for k in keys if k.endswith(("1", "2"))]
    bulk(src.url, [set_op(k, b"B-lost") for k in lost_keys[:20]] + [del_op(k) for k in lost_keys[20:30]],
         durability="memory")
    archive_dir = tmp_path / "archive"
    run1 = create_backup(archive_dir, src.url, idle_timeout=30).manifest
    state1 = read_state(src.url, keys)
    assert sum(v == b"B-lost" for v in state1.values()) == 20

    src.kill()  # unpersisted B is gone; the restarted server starts a new history branch
    src = upr_server(partitions=parts, data_dir=data)
    after_crash = read_state(src.url, keys)
    assert not any(v == b"B-lost" for v in after_crash.values())
    bulk(src.url, [set_op(k, b"C-" + k.encode()) for k in keys[::7]] + [del_op(k) for k in keys[3::11]])
    result = create_backup(archive_dir, src.url, idle_timeout=30)
    run2 = result.manifest
    rolled = {p: rec.rollbacks[0] for p, rec in run2.partitions.items() if rec.rollbacks}
    assert rolled, "the crash should have forced at least one rollback"
    for p, rb in rolled.items():
        assert rb.requested == run1.partitions[p].end
        assert 0 < rb.to_seqno < run1.partitions[p].end.seqno  # narrow: back to the persisted point
        assert run2.partitions[p].start.seqno == rb.to_seqno
    archive = Archive.open(archive_dir)
    report = verify(archive)
    assert report.ok, report.problems
    info = cli("info", "--archive", str(archive_dir), "--json", check=True)
    doc = json.loads(info.stdout)
    assert {r["partition"] for r in doc["runs"][1]["rollbacks"]} == set(rolled)

    source2 = read_state(src.url, keys)
    for run, want, name in ((run2, source2, "after"), (run1, state1, "before")):
        dst = upr_server(partitions=parts, data_dir=tmp_path / f"dst-{name}")
        restore(archive, dst.url, run_spec=run.run_id)
        assert read_state(dst.url, keys) == want, f"restore of the run {name} the crash differs"
        dst.kill()


def test_verify_and_restore_name_the_corrupt_segment_and_offset(upr_server: Callable, tmp_path: Path) -> None:
    src = upr_server(partitions=4, data_dir=tmp_path / "src")
    keys = [f"c{i}" for i in range(3000)]
    bulk(src.url, [set_op(k, os.urandom(200)) for k in keys])
    archive_dir = tmp_path / "archive"
    r = cli("create", "--archive", str(archive_dir), "--server", src.url, "--block-kib", "64", check=True)
    assert "full" in r.stdout
    assert cli("verify", "--archive", str(archive_dir)).returncode == 0
    run = Archive.open(archive_dir).runs()[0]
    seg = archive_dir / "runs" / run.run_id / run.partitions[2].segment
    data = bytearray(seg.read_bytes())
    data[len(data) // 2] ^= 0x20
    seg.write_bytes(bytes(data))

    r = cli("verify", "--archive", str(archive_dir))
    assert r.returncode == 1
    assert f"runs/{run.run_id}/p0002.seg at offset " in r.stdout, r.stdout
    r = cli("verify", "--archive", str(archive_dir), "--json")
    problems = json.loads(r.stdout)["problems"]
    assert problems[0]["path"] == f"runs/{run.run_id}/p0002.seg" and problems[0]["partition"] == 2
    assert 0 < problems[0]["offset"] <= len(data) // 2

    dst = upr_server(partitions=4, data_dir=tmp_path / "dst")
    r = cli("restore", "--archive", str(archive_dir), "--server", dst.url, "--partitions", "2")
    assert r.returncode == 1 and f"p0002.seg at offset" in r.stderr, r.stderr

    # other clear errors: another keyspace, an unreachable server
    r = cli("create", "--archive", str(archive_dir), "--server", dst.url)
    assert r.returncode == 1 and "was made from keyspace" in r.stderr
    dst.kill()
    r = cli("create", "--archive", str(archive_dir), "--server", dst.url)
    assert r.returncode == 3 and "cannot reach" in r.stderr, r.stderr


def test_server_crash_during_a_backup_cuts_back_to_an_exact_boundary(upr_server: Callable, tmp_path: Path) -> None:
    port = free_port()
    parts = 2
    data = tmp_path / "src"
    args = ["--flush-interval-ms", "60000", "--port", str(port)]
    src = upr_server(partitions=parts, data_dir=data, args=args)
    persisted = [f"a{i}" for i in range(3000)]
    # more unpersisted data than the client's flow-control window (8 MiB): the kill lands mid-stream
    volatile = [f"b{i}" for i in range(24000)]
    bulk(src.url, [set_op(k, b"A" * 50) for k in persisted], durability="persist", chunk=1000)
    bulk(src.url, [set_op(k, os.urandom(1000)) for k in volatile], durability="memory", chunk=2000)
    servers = [src]

    def crash_midway(done: int, total: int) -> None:
        if done >= 3000 + 8000 and len(servers) == 1:  # well inside the unpersisted memory snapshot
            servers[0].kill()
            servers.append(upr_server(partitions=parts, data_dir=data, args=args))

    result = create_backup(tmp_path / "archive", src.url, idle_timeout=60, progress=crash_midway)
    assert len(servers) == 2, "the crash did not happen during the backup"
    # at least one partition was mid-stream: it finished on the new branch, at its high seqno (the
    # client lowered its "until now" goal), after being cut back to an exact boundary if it had
    # taken items the crash lost; a partition still in the persisted part needs no cut-back, and
    # partitions already complete keep what the server had then
    src = servers[1]
    archive = Archive.open(tmp_path / "archive")
    assert verify(archive).ok
    highs = {i["partition"]: i for i in httpx.get(f"{src.url}/partitions").json()["partitions"]}
    run1 = result.manifest
    on_new_branch = [p for p, rec in run1.partitions.items()
                     if rec.end.uuid == highs[p]["failover_log"][0]["uuid"] != rec.start.uuid]
    assert on_new_branch, "a partition should have finished on the restarted server's new branch"
    for p in on_new_branch:
        assert run1.partitions[p].end.seqno == highs[p]["high_seqno"]
    for p, _seqno in result.in_run_rollbacks:
        rec = run1.partitions[p]
        assert rec.restarts and rec.restarts[0][1] <= rec.restarts[0][0]  # cut back at or below the point
        assert rec.end.seqno == highs[p]["high_seqno"] and rec.end.uuid == highs[p]["failover_log"][0]["uuid"]

    doc = json.loads(cli("info", "--archive", str(tmp_path / "archive"), "--json", check=True).stdout)
    assert {r["partition"] for r in doc["runs"][0]["restarts"]} == {p for p, _ in result.in_run_rollbacks}
    bulk(src.url, [set_op(k, b"C" * 10) for k in volatile[:500]])
    run2 = create_backup(tmp_path / "archive", src.url, idle_timeout=30).manifest
    for p, rec in run2.partitions.items():
        if run1.partitions[p].end.seqno > highs[p]["high_seqno"]:  # took data the crash then lost
            assert rec.rollbacks, f"partition {p} should have been rolled back"
            # narrow: the persisted point is the end of the disk snapshot run 1 completed
            assert rec.start.seqno == rec.rollbacks[0].to_seqno == highs[p]["high_seqno"]
    assert verify(archive).ok
    keys = persisted[::10] + volatile[:600:2] + volatile[-50:]
    want = read_state(src.url, keys)
    dst = upr_server(partitions=parts, data_dir=tmp_path / "dst")
    restore(archive, dst.url)
    assert read_state(dst.url, keys) == want


def test_purged_tombstones_force_a_full_retake_that_never_resurrects_deleted_keys(
        upr_server: Callable, tmp_path: Path) -> None:
    parts = 2
    src = upr_server(partitions=parts, data_dir=tmp_path / "src")
    keys = [f"p{i}" for i in range(300)]
    bulk(src.url, [set_op(k, b"v1-" + k.encode()) for k in keys])
    archive_dir = tmp_path / "archive"
    run1 = create_backup(archive_dir, src.url, idle_timeout=30).manifest
    state1 = read_state(src.url, keys)
    # deletions the next incremental would have to see, then purged before it runs
    bulk(src.url, [del_op(k) for k in keys[::3]] + [set_op(k, b"v2") for k in keys[1::3]])
    highs = {i["partition"]: i["high_seqno"] for i in httpx.get(f"{src.url}/partitions").json()["partitions"]}
    r = httpx.post(f"{src.url}/admin/compact", json={"purge_before_seqno": {str(p): h + 1 for p, h in highs.items()}})
    assert r.status_code == 200, r.text
    assert all(v > run1.partitions[int(p)].end.seqno for p, v in r.json()["purge_seqnos"].items())

    run2 = create_backup(archive_dir, src.url, idle_timeout=30).manifest
    for rec in run2.partitions.values():  # the server cannot tell us what was deleted: retaken from 0
        assert rec.rollbacks and rec.rollbacks[0].to_seqno == 0 and rec.start.seqno == 0
    archive = Archive.open(archive_dir)
    assert verify(archive).ok
    state2 = read_state(src.url, keys)
    assert sum(v is None for v in state2.values()) == 100
    for run, want, name in ((run2, state2, "after"), (run1, state1, "before")):
        dst = upr_server(partitions=parts, data_dir=tmp_path / f"dst-{name}")
        restore(archive, dst.url, run_spec=run.run_id)
        assert read_state(dst.url, keys) == want, f"restore of the run {name} the purge differs"
        dst.kill()


def test_a_failed_run_keeps_its_progress_for_the_next_one(upr_server: Callable, tmp_path: Path) -> None:
    from clients.errors import ConnectionFailed

    parts = 2
    data = tmp_path / "src"
    src = upr_server(partitions=parts, data_dir=data)
    keys = [f"f{i}" for i in range(16000)]
    bulk(src.url, [set_op(k, os.urandom(1000)) for k in keys], chunk=2000)  # persisted: nothing is lost
    archive_dir = tmp_path / "archive"
    killed = []

    def server_dies(done: int, total: int) -> None:
        if done >= 6000 and not killed:
            src.kill()
            killed.append(done)

    with pytest.raises(ConnectionFailed):
        create_backup(archive_dir, src.url, idle_timeout=30, progress=server_dies, reconnect_attempts=2)
    archive = Archive.open(archive_dir)
    assert archive.runs() == [] and verify(archive).ok
    src = upr_server(partitions=parts, data_dir=data)
    result = create_backup(archive_dir, src.url, idle_timeout=30)
    assert result.resumed and result.resumed_at, "the failed run's streamed data should have been adopted"
    assert verify(archive).ok
    sample = keys[::97]
    want = read_state(src.url, sample)
    dst = upr_server(partitions=parts, data_dir=tmp_path / "dst")
    restore(archive, dst.url)
    assert read_state(dst.url, sample) == want


def test_rollback_to_a_point_the_archive_holds_no_exact_state_at_restarts_below_it(
        upr_server: Callable, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's restart path (``Consumer.seek`` while the rollback is reported): the archive
    is made to hold an exact state only at 0 (as if every run were one deduplicated snapshot), so
    the server's narrow point cannot be used and each rolled-back partition is retaken from 0."""
    import clients.backup.driver as driver

    parts = 2
    data = tmp_path / "src"
    src = upr_server(partitions=parts, data_dir=data, args=["--flush-interval-ms", "60000"])
    keys = [f"key-{i}" for i in range(100)]
    bulk(src.url, [set_op(k, b"A-" + k.encode()) for k in keys], durability="persist")
    bulk(src.url, [set_op(k, b"B-lost") for k in keys[:30]] + [del_op(k) for k in keys[30:40]], durability="memory")
    archive_dir = tmp_path / "archive"
    run1 = create_backup(archive_dir, src.url, idle_timeout=30).manifest
    state1 = read_state(src.url, keys)

    src.kill()
    src = upr_server(partitions=parts, data_dir=data)
    bulk(src.url, [set_op(k, b"C-" + k.encode()) for k in keys[::7]] + [del_op(k) for k in keys[3::11]])
    monkeypatch.setattr(driver, "archived_boundaries", lambda runs, ps: {p: [0] for p in ps})
    run2 = create_backup(archive_dir, src.url, idle_timeout=30).manifest
    rolled = {p: rec.rollbacks[0] for p, rec in run2.partitions.items() if rec.rollbacks}
    assert rolled, "the crash should have forced at least one rollback"
    for p, rb in rolled.items():
        assert rb.requested == run1.partitions[p].end
        assert rb.to_seqno == 0 and run2.partitions[p].start.seqno == 0  # retaken from the exact state below
        assert "retaken from 0" in rb.reason
    archive = Archive.open(archive_dir)
    assert verify(archive).ok
    source2 = read_state(src.url, keys)
    for run, want, name in ((run2, source2, "after"), (run1, state1, "before")):
        dst = upr_server(partitions=parts, data_dir=tmp_path / f"dst-{name}")
        restore(archive, dst.url, run_spec=run.run_id)
        assert read_state(dst.url, keys) == want, f"restore of the run {name} the crash differs"
        dst.kill()
