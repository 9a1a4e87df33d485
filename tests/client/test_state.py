"""Consumer state: round trip, atomic replace, corrupt files refused with a typed error."""
import pytest

from clients.errors import StateCorrupt
from clients.state import ConsumerState, FileStateStore, MemoryStateStore, PartitionCheckpoint, StateStore
from engine.core.types import FailoverEntry
from engine.protocol.client.offset import StreamOffset


def sample() -> ConsumerState:
    return ConsumerState(
        {0: PartitionCheckpoint(StreamOffset(9, 7, 5, 9), (FailoverEntry(9, 3), FailoverEntry(4, 0)), (1, 4)),
         12: PartitionCheckpoint(StreamOffset.beginning())},
        node_id="n1", partition_count=16)


def test_roundtrip(tmp_path):
    store = FileStateStore(tmp_path / "st")
    assert store.load() is None
    store.save(sample())
    assert store.load() == sample()
    assert isinstance(store, StateStore) and isinstance(MemoryStateStore(), StateStore)
    assert store.ring_directory == tmp_path / "st"
    assert sorted(p.name for p in (tmp_path / "st").iterdir()) == ["lock", "state.json"]  # no temp left behind


@pytest.mark.parametrize("raw", [b"", b"{", b'{"version":1}', b'{"version":2,"partitions":{}}',
                                 b'{"version":1,"partitions":{"0":{"offset":{"uuid":1,"seqno":9,'
                                 b'"snap_start":0,"snap_end":5}}}}'])
def test_corrupt_files_are_refused(tmp_path, raw):
    (tmp_path / "state.json").write_bytes(raw)
    with pytest.raises(StateCorrupt):
        FileStateStore(tmp_path).load()


def test_memory_store():
    store = MemoryStateStore()
    store.save(sample())
    assert store.load() == sample() and store.saves == 1
    assert sample().offsets()[0] == StreamOffset(9, 7, 5, 9)


def test_one_consumer_per_state_directory(tmp_path):
    from clients.errors import UsageError

    first = FileStateStore(tmp_path)
    first.save(sample())
    (tmp_path / "state.json.tmp.999999").write_bytes(b"{")  # as left by a process killed mid-save
    second = FileStateStore(tmp_path)
    with pytest.raises(UsageError, match="in use"):
        second.load()
    first.close()
    assert second.load() == sample()
    assert not list(tmp_path.glob("state.json.tmp.*"))
    second.close()


async def test_consumers_share_no_state_directory_and_release_it_on_errors(tmp_path):
    from clients import Consumer, StateCorrupt, UsageError

    first = Consumer("http://127.0.0.1:1", state=tmp_path)
    with pytest.raises(UsageError, match="in use"):
        Consumer("http://127.0.0.1:1", state=tmp_path)
    await first.close()
    (tmp_path / "state.json").write_bytes(b"{broken")
    with pytest.raises(StateCorrupt):
        Consumer("http://127.0.0.1:1", state=tmp_path)
    second = Consumer("http://127.0.0.1:1", state=tmp_path, start="beginning")  # the failed one let go
    await second.close()
