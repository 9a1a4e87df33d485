"""Archive, runs, resume, rollback chains, verify, merge and restore planning, without a server.

The model (``offline.History``) is the truth: after any sequence of runs, the restore plan as of
run k must equal the model's state at that run's ends, tombstones included.
"""
from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

import pytest

from clients.backup.archive import MANIFEST, Archive, merged_run_id, new_run_id
from clients.backup.driver import archived_boundaries
from clients.backup.errors import ArchiveNotFound, ContinuityError, CorruptArchive, KeyspaceMismatch, RunNotFound
from clients.backup.fsutil import atomic_write
from clients.backup.info import archive_info
from clients.backup.manifest import RunManifest, read_sealed, seal, unseal
from clients.backup.merge import merge
from clients.backup.plan import summarize
from clients.backup.runwriter import RunWriter
from clients.backup.verify import verify
from engine.protocol.client.offset import StreamOffset

from .offline import UUID, History, expected_state, previous_ends, restored_state, run_ends, take_partition, write_run

P = 4


def _archive(tmp_path: Path) -> Archive:
    return Archive.open_or_create(tmp_path / "arch", "node-a", P)


def _live(state: dict[int, dict[bytes, bytes | None]]) -> dict[int, dict[bytes, bytes]]:
    return {p: {k: v for k, v in s.items() if v is not None} for p, s in state.items()}


def _history_with_runs(archive: Archive, runs: int = 4, seed: int = 7) -> tuple[History, list[RunManifest]]:
    rng = random.Random(seed)
    h = History(P)
    out = []
    for _ in range(runs):
        h.random_writes(rng, 120)
        write_run(archive, h)
        out.append(archive.runs()[-1])
    return h, out


# ------------------------------------------------------------------ identity
def test_archive_is_bound_to_its_keyspace(tmp_path: Path) -> None:
    _archive(tmp_path)
    with pytest.raises(KeyspaceMismatch, match="made from keyspace 'node-a' but the server is 'node-b'"):
        Archive.open_or_create(tmp_path / "arch", "node-b", P)
    with pytest.raises(KeyspaceMismatch, match="holds 4 partitions but the server has 8"):
        Archive.open_or_create(tmp_path / "arch", "node-a", 8)
    assert Archive.open_or_create(tmp_path / "arch", "node-a", P).meta.node_id == "node-a"


def test_refuses_foreign_directories(tmp_path: Path) -> None:
    with pytest.raises(ArchiveNotFound, match="not a backup archive"):
        Archive.open(tmp_path)
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "photo.jpg").write_bytes(b"!")
    with pytest.raises(ArchiveNotFound, match="not empty"):
        Archive.open_or_create(tmp_path / "x", "n", 1)


def test_sealed_documents_detect_tampering() -> None:
    data = seal({"a": 1, "b": [1, 2]})
    assert unseal(data, path="m") == {"a": 1, "b": [1, 2]}
    with pytest.raises(CorruptArchive, match="m: checksum mismatch"):
        unseal(data.replace(b'"a": 1', b'"a": 2'), path="m")
    with pytest.raises(CorruptArchive, match="not a sealed JSON"):
        unseal(data[:-5], path="m")


def test_run_ids_sort_in_time_and_merges_sort_after_their_last_run() -> None:
    a = new_run_id(now=1_700_000_000.0)
    b = new_run_id(after=a, now=1_600_000_000.0)  # clock stepped back
    assert a < b < new_run_id(after=b)
    m = merged_run_id(b)
    assert b < m < merged_run_id(m) < new_run_id(after=m)


# ------------------------------------------------------------------ runs and restore plans
def test_full_then_incrementals_restore_the_state_as_of_each_run(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive)
    assert [r.kind for r in runs] == ["full", "incremental", "incremental", "incremental"]
    for run in runs:
        assert restored_state(archive, run.run_id) == expected_state(h, run_ends(run))
    assert verify(archive).ok


def test_partition_and_key_filters(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=2)
    got = restored_state(archive, None, partitions=[1], key_filter=r"-1\d$")
    want = {k: v for k, v in h.state(1, run_ends(runs[-1])[1]).items() if re.search(r"-1\d$", k.decode())}
    assert got == {1: want} and want
    s = summarize(archive, None, [1], re.compile(r"-1\d$"))
    assert s.sets + s.deletes == len(want) and s.skipped_keys > 0


def test_find_run_by_id_prefix_index_and_latest(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    _, runs = _history_with_runs(archive, runs=3)
    assert archive.find_run(None) == runs[-1] == archive.find_run("latest") == archive.find_run("3")
    assert archive.find_run("1") == runs[0]
    assert archive.find_run(runs[1].run_id) == runs[1]
    with pytest.raises(RunNotFound, match="out of range"):
        archive.find_run("4")
    with pytest.raises(RunNotFound, match="no complete run 'zzz'"):
        archive.find_run("zzz")


# ------------------------------------------------------------------ interrupted runs
def test_interrupted_run_is_invisible_and_resumes_only_missing_partitions(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=1)
    h.random_writes(random.Random(1), 200)
    run = write_run(archive, h, only={0, 2}, commit=False)
    # a partition mid-stream when the process died: a segment with no part record
    w = run.partition(3, previous_ends(archive)[3])
    w.snapshot(1, 10, "disk")
    w.add_many([i for i in h.changes[3] if i.seqno > previous_ends(archive)[3].seqno][:1])
    w._segment().flush_block()
    del run, w

    assert archive.runs() == runs  # readers see only the committed run
    assert len(archive.partial_runs()) == 1
    assert verify(archive).ok
    partial = archive_info(archive)["partial_runs"]
    assert [(x["partitions_done"], x["partitions"]) for x in partial] == [(2, P)] and partial[0]["bytes"] > 0
    done_before = {p: (archive.run_dir(archive.partial_runs()[0]) / f"p{p:04d}.seg").stat().st_mtime_ns for p in (0, 2)}

    resumed = RunWriter.begin(archive, server="offline")
    assert resumed.resumed and sorted(resumed.done) == [0, 2]
    ends = previous_ends(archive)
    w3 = resumed.partition(3, ends[3])  # no checkpoint survived in its segment: nothing is adopted
    assert w3.resume_offset is None and not w3.path.exists()
    for p in (1, 3):
        take_partition(resumed, h, p, ends[p])
    manifest = resumed.commit("node-a", P)
    assert manifest.resumed == 1
    for p in (0, 2):  # finished partitions were not taken again
        assert (resumed.dir / f"p{p:04d}.seg").stat().st_mtime_ns == done_before[p]
    assert restored_state(archive, None) == expected_state(h, run_ends(manifest))
    assert verify(archive).ok


def test_debris_run_without_run_file_is_discarded(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    _history_with_runs(archive, runs=1)
    debris = archive.runs_dir / new_run_id(after=archive.runs()[-1].run_id)
    debris.mkdir()
    run = RunWriter.begin(archive)
    assert not run.resumed and not debris.exists()


@pytest.mark.parametrize(("held", "wanted", "conflict"), [
    ("write", "write", True),    # two backups at once
    ("write", "merge", True),
    ("merge", "read", True),     # a merge deletes what readers read
    ("read", "merge", True),
    ("write", "read", False),    # info/verify/restore during a backup: they ignore partial runs
    ("read", "write", False),
    ("read", "read", False),
])
def test_locks(tmp_path: Path, held: str, wanted: str, conflict: bool) -> None:
    from clients.backup.errors import ArchiveLocked

    archive = _archive(tmp_path)
    with archive.lock(held):
        if conflict:
            with pytest.raises(ArchiveLocked, match="in use"):
                with Archive.open(archive.root).lock(wanted):
                    pass
        else:
            with Archive.open(archive.root).lock(wanted):
                pass
    with archive.lock(wanted):
        pass


# ------------------------------------------------------------------ rollbacks
def _rolled_back_run(archive: Archive, h: History, p: int, to_seqno: int) -> RunManifest:
    """The server lost partition p's history after ``to_seqno`` and then took new writes."""
    run = RunWriter.begin(archive)
    ends = previous_ends(archive)
    for q in range(P):
        if q == p:
            continue
        take_partition(run, h, q, ends[q])
    w = run.partition(p, ends[p])
    w.snapshot(ends[p].seqno + 1, ends[p].seqno + 1, "memory")  # something arrived, then the server refused
    w.rollback(ends[p], to_seqno, StreamOffset.at(UUID, to_seqno), reason="diverged")
    w.abort()
    run.done.pop(p, None)
    take_partition_from(run, h, p, StreamOffset.at(UUID, to_seqno), rollback=(ends[p], to_seqno))
    return run.commit("node-a", P)


def take_partition_from(run: RunWriter, h: History, p: int, start: StreamOffset, rollback: tuple) -> None:
    from .offline import dedup

    w = run.partition(p, rollback[0])
    w.rollback(rollback[0], rollback[1], start, reason="diverged")
    items = [i for i in h.changes[p] if i.seqno > start.seqno]
    end = max(h.high(p), start.seqno)
    if items:
        w.snapshot(start.seqno + 1, end, "memory")
        w.add_many(dedup(items))
    w.finish(StreamOffset.at(UUID, end))


@pytest.mark.parametrize("to_seqno", ["middle", "zero"])
def test_rollback_never_mixes_histories(tmp_path: Path, to_seqno: str) -> None:
    archive = _archive(tmp_path)
    rng = random.Random(3)
    h, runs = _history_with_runs(archive, runs=2)
    p = 1
    end = run_ends(runs[-1])[p]
    # the server's point moved down to a seqno where the archive is exact (what create's decide() does)
    exact = archived_boundaries(archive.runs(), [p])[p]
    point = max(b for b in exact if b <= end // 2) if to_seqno == "middle" else 0
    assert to_seqno == "zero" or point > 0
    h.truncate(p, point)  # lost branch: seqnos (point, end] are gone on the server
    for _ in range(40):  # the new branch reuses those seqnos with other content
        h.write(p, f"k{p}-{rng.randrange(50)}", None if rng.random() < 0.3 else b"new-branch")
    rb_run = _rolled_back_run(archive, h, p, point)
    assert rb_run.partitions[p].rollbacks[0].to_seqno == point
    assert restored_state(archive, rb_run.run_id) == expected_state(h, run_ends(rb_run))
    # the earlier runs still restore what the server had back then
    assert restored_state(archive, runs[0].run_id)[0] == expected_state(h, run_ends(runs[0]))[0]
    report = verify(archive)
    assert report.ok, report.problems
    info = archive_info(archive)
    assert info["runs"][-1]["rollbacks"] == [
        {"partition": p, "from": runs[-1].partitions[p].end.to_dict(), "to_seqno": point, "reason": "diverged"}
    ]


# ------------------------------------------------------------------ verify
def test_verify_names_file_and_offset_of_a_corrupt_segment(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    _, runs = _history_with_runs(archive, runs=2)
    rec = runs[1].partitions[2]
    path = archive.segment_path(runs[1].run_id, rec.segment)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x55
    path.write_bytes(bytes(data))
    report = verify(archive)
    assert len(report.problems) == 1
    err = report.problems[0]
    assert isinstance(err, CorruptArchive)
    assert err.path == f"runs/{runs[1].run_id}/p0002.seg" and err.offset is not None and err.offset > 0
    assert err.partition == 2


def test_verify_reports_size_missing_file_and_broken_chain(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    _, runs = _history_with_runs(archive, runs=3)
    path0 = archive.segment_path(runs[0].run_id, runs[0].partitions[0].segment)
    with open(path0, "ab") as fh:
        fh.write(b"junk")
    archive.segment_path(runs[1].run_id, runs[1].partitions[1].segment).unlink()
    # forge run 3's partition 3 to start after a gap
    doc = read_sealed(archive.run_dir(runs[2].run_id) / MANIFEST)
    start = doc["partitions"]["3"]["start"]
    start["seqno"] = start["snap_start"] = start["snap_end"] = start["seqno"] + 2
    doc["partitions"]["3"]["end"]["seqno"] = max(doc["partitions"]["3"]["end"]["seqno"], start["seqno"])
    doc["partitions"]["3"]["end"]["snap_start"] = doc["partitions"]["3"]["end"]["snap_end"] = doc["partitions"]["3"]["end"]["seqno"]
    doc["partitions"]["3"]["first_seqno"] = 0
    doc["partitions"]["2"]["end"]["uuid"] = 4242  # a branch its own failover log never had
    atomic_write(archive.run_dir(runs[2].run_id) / MANIFEST, seal(doc))
    report = verify(archive)
    text = "\n".join(str(p) for p in report.problems)
    assert "p0000.seg at offset" in text and "the manifest says" in text
    assert "p0001.seg: segment file is missing" in text
    assert any(isinstance(p, ContinuityError) and p.partition == 3 for p in report.problems), text
    assert "partition 2: run" in text and "ends on branch uuid 4242" in text


def test_tampered_manifest_is_reported(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    _, runs = _history_with_runs(archive, runs=1)
    m = archive.run_dir(runs[0].run_id) / MANIFEST
    m.write_bytes(m.read_bytes().replace(b'"kind": "full"', b'"kind": "fool"'))
    report = verify(archive)
    assert not report.ok and "manifest.json: checksum mismatch" in str(report.problems[0])


# ------------------------------------------------------------------ merge
def test_merge_keeps_every_restorable_state(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=5)
    before = {r.run_id: restored_state(archive, r.run_id) for r in runs}
    merged = merge(archive, runs[1].run_id, runs[3].run_id)
    live = archive.runs()
    assert [r.run_id for r in live] == [runs[0].run_id, merged.run_id, runs[4].run_id]
    assert merged.kind == "merged" and merged.merged_from[:3] == tuple(r.run_id for r in runs[1:4])
    assert not archive.run_dir(runs[2].run_id).exists()
    assert restored_state(archive, runs[0].run_id) == before[runs[0].run_id]
    assert restored_state(archive, merged.run_id) == before[runs[3].run_id]
    assert restored_state(archive, runs[4].run_id) == before[runs[4].run_id]
    assert verify(archive).ok
    # fold everything into one: tombstones with nothing older to delete are dropped
    everything = merge(archive, "1", "latest")
    assert [r.run_id for r in archive.runs()] == [everything.run_id]
    assert _live(restored_state(archive, None)) == _live(before[runs[4].run_id])
    assert verify(archive).ok
    assert archive.runs()[0].bytes < sum(r.bytes for r in runs)


def test_merge_then_incremental_continues_the_chain(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=3)
    merge(archive, "1", "3")
    h.random_writes(random.Random(9), 100)
    write_run(archive, h)
    last = archive.runs()[-1]
    assert _live(restored_state(archive, None)) == _live(expected_state(h, run_ends(last)))
    assert verify(archive).ok


def test_rollback_below_a_merge_floor_is_refused_loudly(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=3)
    merged = merge(archive, "1", "3")
    p = 0
    floor = merged.partitions[p].merge_floor
    assert floor > 0
    h.truncate(p, floor - 1)  # (not an exact point either way: the merge keeps none below its floor)
    h.write(p, "k0-1", b"after")
    _rolled_back_run(archive, h, p, floor - 1)
    with pytest.raises(ContinuityError, match=f"rolled back to seqno {floor - 1}, below what merged run"):
        restored_state(archive, None, partitions=[p])
    # the other partitions are unaffected
    assert _live(restored_state(archive, None, partitions=[1])) == _live({1: h.state(1, run_ends(archive.runs()[-1])[1])})


def test_rollback_into_the_last_merged_run_is_exact(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=3)
    merged = merge(archive, "1", "3")
    p = 2
    floor, end = merged.partitions[p].merge_floor, merged.partitions[p].end.seqno
    point = max(b for b in merged.partitions[p].boundaries if b < end)
    assert floor < point < end
    h.truncate(p, point)
    h.write(p, "k2-7", b"after")
    rb = _rolled_back_run(archive, h, p, point)
    assert _live(restored_state(archive, None, partitions=[p])) == _live({p: h.state(p, run_ends(rb)[p])})


def test_crash_during_merge_leaves_sources_intact(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    _, runs = _history_with_runs(archive, runs=3)
    before = restored_state(archive, None)
    # crash before the commit rename: a .merging directory
    (archive.runs_dir / (merged_run_id(runs[2].run_id) + ".merging")).mkdir()
    assert archive.runs() == runs
    # crash after the commit rename but before deleting the sources
    backup = tmp_path / "keep"
    shutil.copytree(archive.run_dir(runs[1].run_id), backup / runs[1].run_id)
    merged = merge(archive, "2", "3")
    shutil.copytree(backup / runs[1].run_id, archive.run_dir(runs[1].run_id))
    assert [r.run_id for r in archive.runs()] == [runs[0].run_id, merged.run_id]
    assert restored_state(archive, None) == before
    with archive.lock():
        assert runs[1].run_id in archive.cleanup()


def test_merge_arguments_are_checked(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    _history_with_runs(archive, runs=2)
    with pytest.raises(RunNotFound, match="after"):
        merge(archive, "2", "1")
    with pytest.raises(RunNotFound, match="same run"):
        merge(archive, "2", "2")


def test_info_reports_runs_counts_sizes(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=2)
    info = archive_info(archive)
    assert [r["run_id"] for r in info["runs"]] == [r.run_id for r in runs]
    total = sum(len(h.changes[p]) for p in range(P))
    assert info["runs"][0]["mutations"] + info["runs"][0]["deletions"] <= 120
    assert sum(r["mutations"] + r["deletions"] for r in info["runs"]) <= total
    assert info["runs"][1]["partitions"]["0"]["start"] == runs[0].partitions[0].end.to_dict()
    assert info["disk_bytes"] >= sum(r.bytes for r in runs)


# ------------------------------------------------------------------ writer details
def test_resume_retakes_a_partition_whose_segment_does_not_match_its_record(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, _ = _history_with_runs(archive, runs=1)
    h.random_writes(random.Random(5), 200)
    run = write_run(archive, h, only={0, 1}, commit=False)
    # power cut after the unsynced part record reached disk but before the segment's tail did
    seg = run.dir / "p0001.seg"
    seg.write_bytes(seg.read_bytes()[:-10])
    resumed = RunWriter.begin(archive)
    assert sorted(resumed.done) == [0]


def test_truncate_keeps_this_runs_items_up_to_the_rollback_point(tmp_path: Path) -> None:
    from .offline import dedup

    archive = _archive(tmp_path)
    h = History(1)
    for i in range(40):
        h.write(0, f"k{i % 9}", f"v{i}".encode())
    a1 = Archive.open_or_create(tmp_path / "one", "n", 1)
    run = RunWriter.begin(a1, block_bytes=64)
    w = run.partition(0, StreamOffset())
    for lo in range(1, 41, 10):
        w.snapshot(lo, lo + 9, "memory")
        snap = dedup([i for i in h.changes[0] if lo <= i.seqno <= lo + 9])
        w.add_many(snap[:3])
        w.checkpoint(UUID)  # after a batch: a position inside the snapshot
        w.add_many(snap[3:])
        w.snapshot_complete(lo + 9, UUID, lo)
    assert w.boundary_at_or_below(25) == 20
    w.truncate(20)  # the server restarted mid-run; 25 lies inside a snapshot, so back to 20
    h.truncate(0, 20)
    for i in range(15):
        h.write(0, f"k{i % 4}", f"new{i}".encode())
    w.snapshot(21, 35, "memory")
    w.add_many(dedup([i for i in h.changes[0] if i.seqno > 20]))
    w.finish(StreamOffset.at(UUID, 35))
    run.commit("n", 1)
    assert verify(a1).ok
    assert restored_state(a1, None) == {0: h.state(0)}
    del archive


def _partial_with_checkpoints(archive: Archive, h: History, p: int, *, tail: bool,
                              tail_checkpoint: bool = False) -> tuple[RunWriter, int]:
    """A killed run that had streamed partition p in snapshots of 7 with checkpoints, plus (tail)
    items of an unfinished snapshot and a torn block after the last checkpoint."""
    from .offline import dedup

    run = RunWriter.begin(archive, block_bytes=256)
    start = previous_ends(archive).get(p, StreamOffset())
    w = run.partition(p, start)
    items = [i for i in h.changes[p] if i.seqno > start.seqno]
    lo, last_ck = start.seqno + 1, start.seqno
    while lo + 6 <= items[-1].seqno - 10:
        w.snapshot(lo, lo + 6, "memory")
        w.add_many(dedup([i for i in items if lo <= i.seqno <= lo + 6]))
        w.snapshot_complete(lo + 6, UUID, lo)
        last_ck = lo + 6
        lo += 7
    if tail:
        w.snapshot(lo, lo + 6, "memory")
        # what the server sends of snapshot lo..lo+6 (deduplicated over all of it), cut after lo+3
        w.add_many([i for i in dedup([i for i in items if lo <= i.seqno <= lo + 6]) if i.seqno <= lo + 3])
        if tail_checkpoint:
            w.checkpoint(UUID)
    w._segment().flush_block()
    w._segment()._inflight and w._segment()._inflight.result()
    w._segment()._fh.flush()
    if tail:
        with open(w.path, "ab") as fh:
            fh.write(b"BLK1" + b"\x00" * 11)  # a block header cut short by the kill
    return run, last_ck


def test_a_killed_run_continues_each_partition_from_its_last_checkpoint(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, _ = _history_with_runs(archive, runs=1)
    h.random_writes(random.Random(21), 400)
    _, last_ck = _partial_with_checkpoints(archive, h, 2, tail=True)
    assert last_ck > previous_ends(archive)[2].seqno

    resumed = RunWriter.begin(archive)
    ends = previous_ends(archive)
    w = resumed.partition(2, ends[2])
    assert w.resume_offset == StreamOffset(UUID, last_ck, last_ck - 6, last_ck)
    assert w.start == ends[2] and w.boundaries[0] == ends[2].seqno and w.boundaries[-1] == last_ck
    from .offline import dedup

    rest = [i for i in h.changes[2] if i.seqno > last_ck]
    w.snapshot(last_ck + 1, h.high(2), "memory")
    w.add_many(dedup(rest))
    w.finish(StreamOffset.at(UUID, h.high(2)))
    for q in (0, 1, 3):
        take_partition(resumed, h, q, ends[q])
    manifest = resumed.commit("node-a", P)
    report = verify(archive)
    assert report.ok, report.problems
    assert restored_state(archive, None) == expected_state(h, run_ends(manifest))


def test_a_killed_runs_rollback_is_remembered_when_its_work_is_adopted(tmp_path: Path) -> None:
    archive = _archive(tmp_path)
    h, runs = _history_with_runs(archive, runs=2)
    p = 1
    end = run_ends(runs[-1])[p]
    point = archived_boundaries(archive.runs(), [p])[p][-2]  # an exact point inside the last run
    assert runs[-1].partitions[p].start.seqno < point < end
    h.truncate(p, point)
    for i in range(60):
        h.write(p, f"k1-{i % 13}", b"branch2")
    run = RunWriter.begin(archive)
    ends = previous_ends(archive)
    w = run.partition(p, ends[p])
    w.rollback(ends[p], point, StreamOffset.at(UUID, point), "diverged")
    from .offline import dedup

    lo = point + 1
    items = [i for i in h.changes[p] if i.seqno > point]
    w.snapshot(lo, lo + 29, "memory")
    w.add_many(dedup([i for i in items if i.seqno <= lo + 29]))
    w.snapshot_complete(lo + 29, UUID, lo)
    w._segment().flush_block()
    w._segment()._inflight and w._segment()._inflight.result()
    w._segment()._fh.flush()
    del run, w  # killed

    resumed = RunWriter.begin(archive)
    w = resumed.partition(p, ends[p])
    assert w.start.seqno == point and w.rollbacks[0].to_seqno == point
    assert w.resume_offset is not None and w.resume_offset.seqno == lo + 29
    w.snapshot(lo + 30, h.high(p), "memory")
    w.add_many(dedup([i for i in items if i.seqno > lo + 29]))
    w.finish(StreamOffset.at(UUID, h.high(p)))
    for q in range(P):
        if q != p:
            take_partition(resumed, h, q, ends[q])
    manifest = resumed.commit("node-a", P)
    assert verify(archive).ok
    assert restored_state(archive, None) == expected_state(h, run_ends(manifest))


def test_a_killed_run_continues_from_inside_a_snapshot(tmp_path: Path) -> None:
    """A checkpoint after a batch is a partial-snapshot position: the resumed stream continues
    there (DCP allows it) and the keys whose versions the cut snapshot had deduplicated arrive
    with their later versions, so the run still ends in the exact state."""
    from .offline import dedup

    archive = _archive(tmp_path)
    h, _ = _history_with_runs(archive, runs=1)
    h.random_writes(random.Random(23), 400)
    _, last_complete = _partial_with_checkpoints(archive, h, 3, tail=True, tail_checkpoint=True)
    resumed = RunWriter.begin(archive)
    ends = previous_ends(archive)
    w = resumed.partition(3, ends[3])
    off = w.resume_offset
    assert off is not None and off.snap_start == last_complete + 1 and off.snap_end == last_complete + 7
    assert last_complete < off.seqno < off.snap_end and w.boundaries[-1] == last_complete
    w.snapshot(off.seqno + 1, h.high(3), "memory")
    w.add_many(dedup([i for i in h.changes[3] if i.seqno > off.seqno]))
    w.finish(StreamOffset.at(UUID, h.high(3)))
    for q in (0, 1, 2):
        take_partition(resumed, h, q, ends[q])
    manifest = resumed.commit("node-a", P)
    assert verify(archive).ok
    assert restored_state(archive, None) == expected_state(h, run_ends(manifest))
