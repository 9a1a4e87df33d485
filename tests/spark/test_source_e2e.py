"""The ``upr`` source itself: batch reads, bounded ranges, admission control, bad options."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from tests.spark.helpers import bulk

pytestmark = pytest.mark.slow


def test_batch_read_and_stream_with_read_limit(spark, upr_server, tmp_path):
    srv = upr_server(partitions=4)
    bulk(srv.url, [{"op": "set", "key": f"k{i}", "value": {"i": i}} for i in range(900)])
    bulk(srv.url, [{"op": "delete", "key": f"k{i}"} for i in range(0, 900, 9)])
    rows = spark.read.format("upr").option("server", srv.url).load().collect()
    assert {r.key for r in rows} == {f"k{i}" for i in range(900)}
    assert sum(r.op == "deletion" for r in rows) == 100
    assert all(r.snap_start <= r.seqno <= r.snap_end for r in rows)

    # minPartitions splits partitions into seqno ranges: same rows, more tasks
    split = spark.read.format("upr").option("server", srv.url).option("minPartitions", "12").load()
    assert split.rdd.getNumPartitions() >= 12
    assert sorted((r.partition, r.seqno) for r in split.collect()) == sorted((r.partition, r.seqno) for r in rows)

    # explicit per-partition ranges: partition 0 only, from its seqno 10 to 30
    uuid = httpx.get(f"{srv.url}/partitions/0").json()["uuid"]
    one = (spark.read.format("upr").option("server", srv.url).option("partitions", "0")
           .option("startingOffsets", json.dumps({"0": {"uuid": str(uuid), "seqno": 10}}))
           .option("endingOffsets", json.dumps({"0": {"seqno": 30, "uuid": str(uuid)}})).load().collect())
    assert one and all(r.partition == 0 and r.seqno > 10 and r.op != "reset" for r in one)
    # endingOffsets is exact: the rows of (10, 30], however far the snapshot holding 30 goes
    assert sorted(r.seqno for r in one) == sorted(r.seqno for r in rows if r.partition == 0 and 10 < r.seqno <= 30)
    # a position on a history the server never had is not followed silently: reset row first
    bad = (spark.read.format("upr").option("server", srv.url).option("partitions", "0")
           .option("startingOffsets", json.dumps({"0": {"uuid": 12345, "seqno": 10}})).load().collect())
    assert bad[0].op == "reset" and bad[0].partition == 0
    with pytest.raises(Exception, match="ROLLBACK_REQUIRED partition 0 to seqno 0"):
        (spark.read.format("upr").option("server", srv.url).option("partitions", "0").option("onRollback", "fail")
         .option("startingOffsets", json.dumps({"0": {"uuid": 12345, "seqno": 10}})).load().collect())

    # streaming, AvailableNow with maxOffsetsPerTrigger: several batches, every row exactly once
    seen = []
    q = (spark.readStream.format("upr").option("server", srv.url).option("maxOffsetsPerTrigger", "400").load()
         .writeStream.foreachBatch(lambda df, b: seen.append((b, df.count())))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert len(seen) >= 3 and all(n <= 400 + 8 for _, n in seen[:-1])
    assert sum(n for _, n in seen) == len(rows)


def _end_offset(progress: dict) -> dict:
    raw = progress["sources"][0].get("endOffset") or {}
    return json.loads(raw) if isinstance(raw, str) else raw


def test_streamed_batches_are_exact_while_a_writer_adds_keys(spark, upr_server, tmp_path):
    """startingOffsets=latest while a writer adds keys: every new key arrives exactly once, with no
    maxOffsetsPerTrigger (a batch's end offset is what it delivered; the next batch starts there)."""
    srv = upr_server(partitions=4)
    bulk(srv.url, [{"op": "set", "key": f"old{i}", "value": 1} for i in range(300)])
    seen: list[tuple[int, int, str]] = []
    q = (spark.readStream.format("upr").option("server", srv.url).option("startingOffsets", "latest").load()
         .writeStream.foreachBatch(lambda df, b: seen.extend((r.partition, r.seqno, r.key) for r in df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).start())
    try:
        deadline = time.monotonic() + 120
        while not any("p" in _end_offset(p) for p in q.recentProgress):
            assert q.exception() is None and time.monotonic() < deadline, "the sentinel batch never ran"
            time.sleep(0.05)
        keys = [f"new{i}" for i in range(1200)]
        for i in range(0, len(keys), 40):       # many small writes: they land while batches are read
            bulk(srv.url, [{"op": "set", "key": k, "value": {"i": k}} for k in keys[i:i + 40]])
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    assert len(seen) == len(set(seen)) == len(keys)
    assert sorted(k for _, _, k in seen) == sorted(keys)


@pytest.mark.parametrize("opts, option", [
    ({"bogus": "1"}, "bogus"),
    ({"startingOffsets": "{not json"}, "startingOffsets"),
    ({"onRollback": "ignore"}, "onRollback"),
])
def test_bad_options_fail_fast_naming_the_option(spark, opts, option):
    with pytest.raises(Exception, match=f"option '{option}'"):
        spark.read.format("upr").option("server", "http://127.0.0.1:9").options(**opts).load().collect()


def test_unreachable_server_fails_after_its_retries_naming_the_cause(spark):
    with pytest.raises(Exception, match=r"GET /partitions from http://127.0.0.1:9: cannot reach http://127.0.0.1:9: "
                                        r".*refused; gave up after 2 attempts"):
        (spark.read.format("upr").option("server", "http://127.0.0.1:9").option("fetchOffset.numRetries", "1")
         .option("fetchOffset.retryIntervalMs", "10").load().collect())


def test_starting_offsets_latest_is_resolved_once_and_resume_ignores_the_option(spark, upr_server, tmp_path):
    srv = upr_server(partitions=4)
    bulk(srv.url, [{"op": "set", "key": f"old{i}", "value": 1} for i in range(200)])
    seen: list[str] = []

    def run(starting: str) -> None:
        q = (spark.readStream.format("upr").option("server", srv.url).option("startingOffsets", starting).load()
             .writeStream.foreachBatch(lambda df, b: seen.extend(r.key for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / "ck")).trigger(availableNow=True).start())
        q.awaitTermination(120)
        assert q.exception() is None

    run("latest")
    assert seen == []                                   # batch 0: sentinel -> now, empty
    bulk(srv.url, [{"op": "set", "key": f"new{i}", "value": 1} for i in range(50)])
    run("earliest")                                     # resumed: the option no longer applies
    assert sorted(seen) == sorted(f"new{i}" for i in range(50))


def test_replayed_task_on_a_dead_branch_is_served_as_a_reset_of_its_partition(upr_server):
    """A batch replayed after the server moved to another history branch (its logged start names a
    uuid the server no longer has): read() cannot re-plan, so it must say ``reset`` and restream
    the partition from 0 up to the planned end, never follow the new branch silently."""
    from spark_connector.planning import WorkItem
    from spark_connector.source import UprInputPartition
    from spark_connector.task import read_task

    srv = upr_server(partitions=2)
    bulk(srv.url, [{"op": "set", "key": f"k{i}", "value": {"i": i}} for i in range(200)])
    parts = {p["partition"]: p for p in httpx.get(f"{srv.url}/partitions").json()["partitions"]}
    high0, high1 = parts[0]["high_seqno"], parts[1]["high_seqno"]
    dead_uuid = (int(parts[0]["uuid"]) + 1) % (1 << 64)          # a branch this server never had
    planned_end = high0 - 5
    items = (WorkItem(0, dead_uuid, 20, 20, 20, planned_end, None, dead_uuid),     # the dead branch
             WorkItem(1, int(parts[1]["uuid"]), 10, 10, 10, high1, None, int(parts[1]["uuid"])))
    part = UprInputPartition(srv.url, None, items, 8192, 30.0)
    rows = [r for rb in read_task(part) for r in rb.to_pylist()]

    controls = [(r["partition"], r["op"], r["seqno"]) for r in rows if r["key"] is None]
    assert controls == [(0, "reset", 0)]
    p0 = [r["seqno"] for r in rows if r["partition"] == 0 and r["key"] is not None]
    p1 = [r["seqno"] for r in rows if r["partition"] == 1 and r["key"] is not None]
    # partition 0 restreamed from 0: its items below the dead start are back, none past the snapshot of the end
    assert min(p0) <= 20 and max(p0) >= planned_end and len(p0) == len(set(p0))
    # partition 1 (its branch is alive) is served as planned: only after its start
    assert p1 and min(p1) > 10
