"""The etcd gateway client against a real etcd: kv, revision-guarded transactions, leases that
expire, watches that see every change from a revision on."""
import asyncio

import pytest

from app.cluster.etcd import Compare, EtcdClient, EtcdUnavailable, Get, Put, prefix_end
from tests.cluster.etcd_server import EtcdProcess


@pytest.fixture
async def client(etcd: EtcdProcess):
    c = EtcdClient([etcd.url])
    yield c
    await c.aclose()


@pytest.mark.parametrize(("prefix", "end"), [(b"a", b"b"), (b"/upr/", b"/upr0"), (b"a\xff", b"b"), (b"\xff", b"\x00")])
def test_prefix_end_is_the_first_key_after_the_prefix(prefix: bytes, end: bytes) -> None:
    assert prefix_end(prefix) == end


async def test_put_get_prefix_and_delete(client: EtcdClient) -> None:
    rev = await client.put(b"/t/a", b"1")
    await client.put(b"/t/b", b"2")
    await client.put(b"/u/c", b"3")
    kv = await client.get(b"/t/a")
    assert kv is not None and kv.value == b"1" and kv.mod_revision == rev and kv.create_revision == rev
    kvs, revision = await client.get_prefix(b"/t/")
    assert [k.key for k in kvs] == [b"/t/a", b"/t/b"] and revision >= rev + 2
    assert await client.delete(b"/t/a") == 1
    assert await client.get(b"/t/a") is None


async def test_a_transaction_guarded_by_mod_revision_lets_only_one_writer_win(client: EtcdClient) -> None:
    rev = await client.put(b"/map", b"r1")
    first = await client.txn([Compare(b"/map", "mod", rev)], [Put(b"/map", b"r2")], [Get(b"/map")])
    second = await client.txn([Compare(b"/map", "mod", rev)], [Put(b"/map", b"r2-other")], [Get(b"/map")])
    assert first.succeeded and not second.succeeded
    assert second.reads[0][0].value == b"r2"


async def test_create_if_absent_is_a_create_revision_compare(client: EtcdClient) -> None:
    absent = [Compare(b"/leader", "create", 0)]
    assert (await client.txn(absent, [Put(b"/leader", b"n1")])).succeeded
    assert not (await client.txn(absent, [Put(b"/leader", b"n2")])).succeeded


async def test_a_key_under_a_lease_goes_when_the_lease_is_not_kept_alive(client: EtcdClient) -> None:
    lease, ttl = await client.grant(1)
    assert ttl >= 1
    await client.put(b"/nodes/n1", b"up", lease=lease)
    assert await client.keepalive(lease) >= 1
    kv = await client.get(b"/nodes/n1")
    assert kv is not None and kv.lease == lease
    for _ in range(100):
        if await client.get(b"/nodes/n1") is None:
            break
        await asyncio.sleep(0.1)
    assert await client.get(b"/nodes/n1") is None
    assert await client.keepalive(lease) == 0


async def test_revoking_a_lease_deletes_its_keys_at_once(client: EtcdClient) -> None:
    lease, _ = await client.grant(30)
    await client.put(b"/nodes/n2", b"up", lease=lease)
    await client.revoke(lease)
    assert await client.get(b"/nodes/n2") is None
    await client.revoke(lease)  # twice is fine: the node may revoke while shutting down


async def test_a_watch_sees_every_change_from_its_start_revision(client: EtcdClient) -> None:
    start = await client.put(b"/w/a", b"1")
    await client.put(b"/w/b", b"2")
    await client.delete(b"/w/a")
    seen = []

    async def collect() -> None:
        async for event in client.watch_prefix(b"/w/", start):
            seen.append((event.kind, event.kv.key, event.kv.value))
            if len(seen) == 4:
                return

    task = asyncio.create_task(collect())
    await asyncio.sleep(0.2)
    await client.put(b"/w/c", b"3")
    await asyncio.wait_for(task, 10)
    assert seen == [("put", b"/w/a", b"1"), ("put", b"/w/b", b"2"), ("delete", b"/w/a", b""), ("put", b"/w/c", b"3")]


async def test_an_unreachable_etcd_is_a_retriable_error_naming_the_endpoints() -> None:
    client = EtcdClient(["http://127.0.0.1:9"], timeout=1)
    try:
        with pytest.raises(EtcdUnavailable, match="127.0.0.1:9") as info:
            await client.get(b"/x")
        assert info.value.retriable
    finally:
        await client.aclose()


async def test_a_second_endpoint_is_used_when_the_first_is_down(etcd: EtcdProcess) -> None:
    client = EtcdClient(["http://127.0.0.1:9", etcd.url], timeout=1)
    try:
        await client.put(b"/k", b"v")
        assert (await client.get(b"/k")).value == b"v"  # type: ignore[union-attr]
    finally:
        await client.aclose()
