"""The replicas' progress kept from a watch: a full reading, then events applied in order; what
the reading already holds is never applied twice, and a deletion comes through (real etcd)."""
import asyncio
import json

from app.cluster.etcd import Delete, EtcdClient, KeyValue, Put, WatchEvent
from app.cluster.layout import Layout
from app.cluster.progress_view import ProgressView
from engine.cluster.promotion import ReplicaProgress
from tests.cluster.etcd_server import EtcdProcess

LAYOUT = Layout("/pv")


def _value(seqno: int, in_sync: bool) -> bytes:
    return json.dumps({"seqno": seqno, "in_sync": in_sync}).encode()


def _event(kind: str, key: bytes, revision: int, value: bytes = b"") -> WatchEvent:
    return WatchEvent(kind, KeyValue(key, value, 0, revision, 1, 0))  # type: ignore[arg-type]


def test_events_at_or_below_the_reading_are_ignored_and_later_ones_applied() -> None:
    view = ProgressView(LAYOUT)
    key = LAYOUT.replica_progress(3, "n2")
    assert not view.ready
    view.reset([KeyValue(key, _value(10, True), 5, 8, 2, 0)], revision=9)
    assert view.ready and view.progress == {(3, "n2"): ReplicaProgress(10, True)}
    assert not view.apply(_event("put", key, 8, _value(7, False)))  # older than the reading
    assert view.progress[(3, "n2")] == ReplicaProgress(10, True)
    assert not view.apply(_event("put", key, 10, _value(12, True)))  # only the seqno moved
    assert view.apply(_event("put", key, 11, _value(12, False)))  # in sync no more: decisions care
    assert view.apply(_event("delete", key, 12))
    assert view.progress == {}
    view.lost()
    assert not view.ready


async def test_a_watch_applied_to_a_reading_ends_equal_to_a_fresh_reading(etcd: EtcdProcess) -> None:
    client = EtcdClient([etcd.url])
    try:
        prefix = LAYOUT.progress
        await client.put(LAYOUT.replica_progress(0, "a"), _value(1, False))
        await client.put(LAYOUT.replica_progress(1, "a"), _value(4, True))
        kvs, revision = await client.get_prefix(prefix)
        view = ProgressView(LAYOUT)
        view.reset(kvs, revision)
        watched = 0

        async def follow() -> None:
            nonlocal watched
            async for event in client.watch_prefix(prefix, revision + 1):
                view.apply(event)
                watched += 1
                if watched == 4:
                    return

        task = asyncio.create_task(follow())
        await client.txn((), [Put(LAYOUT.replica_progress(0, "a"), _value(9, True)),
                              Put(LAYOUT.replica_progress(2, "b"), _value(3, False))])
        await client.txn((), [Delete(LAYOUT.replica_progress(1, "a"))])
        await client.put(LAYOUT.replica_progress(2, "b"), _value(5, True))
        await asyncio.wait_for(task, 10)
        fresh = ProgressView(LAYOUT)
        fresh.reset(*(await client.get_prefix(prefix)))
        assert view.progress == fresh.progress == {(0, "a"): ReplicaProgress(9, True),
                                                   (2, "b"): ReplicaProgress(5, True)}
    finally:
        await client.aclose()
