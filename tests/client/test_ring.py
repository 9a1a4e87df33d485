"""Rollback ring: bounded, covers what it claims, durable across a kill, torn tails cut off."""
import os

import pytest

from clients.errors import StateCorrupt, UsageError
from clients.ring import FILE_NAME, RingEntry, RollbackRing


def test_bounded_and_floor_rises_on_eviction():
    ring = RollbackRing(4)
    ring.set_floor(0, 0)
    ring.set_floor(1, 0)
    for s in range(1, 4):
        ring.append(0, s, b"a%d" % s)
        ring.append(1, s, b"b%d" % s)
    assert len(ring) == 4
    assert ring.floor(0) == 1 and ring.floor(1) == 1  # evicted (0,1),(1,1)
    assert ring.oldest_seqno(0) == 2 and ring.oldest_seqno(1) == 2
    assert ring.covers(0, 1) and not ring.covers(0, 0)
    ring.append(0, 4, b"a4")
    assert ring.floor(0) == 2 and ring.floor(1) == 1 and ring.oldest_seqno(0) == 3


QUERIES = [
    # (partition, R, keys above R, covered)
    (0, 0, [b"k1", b"k2", b"k3"], True),
    (0, 2, [b"k3", b"k1"], True),   # distinct keys in first-applied order above R
    (0, 5, [], True),
    (1, 0, [b"x"], True),
    (2, 0, [], False),              # partition never declared
]


@pytest.mark.parametrize("partition,r,keys,covered", QUERIES)
def test_queries(partition, r, keys, covered):
    ring = RollbackRing(100)
    ring.set_floor(0, 0)
    ring.set_floor(1, 0)
    for s, k in [(1, b"k1"), (2, b"k2"), (3, b"k3"), (4, b"k1")]:
        ring.append(0, s, k)
    ring.append(1, 1, b"x")
    assert ring.keys_above(partition, r) == keys
    assert ring.covers(partition, r) is covered


def test_undeclared_partition_covers_from_just_below_its_first_entry():
    ring = RollbackRing(10)
    ring.append(5, 40, b"k")
    assert ring.floor(5) == 39 and ring.covers(5, 39) and not ring.covers(5, 38)


def test_drop_above_and_reset():
    ring = RollbackRing(10)
    ring.set_floor(0, 0)
    ring.append_batch(0, [1, 2, 3], [b"a", b"b", b"c"])
    ring.append(1, 1, b"z")
    assert ring.drop_above(0, 1) == 2
    assert ring.entries(0) == [RingEntry(0, 1, b"a")]
    ring.reset(1)
    assert ring.entries(1) == [] and ring.floor(1) == 0


def test_durable_replay(tmp_path):
    ring = RollbackRing(5, tmp_path)
    ring.set_floor(0, 0)
    ring.append_batch(0, [1, 2, 3], [b"a", b"b", b"c"])
    ring.drop_above(0, 2)
    ring.append_batch(0, [3, 4, 5, 6], [b"c2", b"d", b"e", b"f"])
    # no close(): a killed process leaves what os.write gave the kernel
    again = RollbackRing(5, tmp_path)
    assert again.entries() == ring.entries()
    assert again.floor(0) == ring.floor(0) == 1


def test_torn_tail_is_cut_and_appends_continue(tmp_path):
    ring = RollbackRing(100, tmp_path)
    ring.set_floor(0, 0)
    ring.append_batch(0, [1, 2], [b"a", b"b"])
    ring.close()
    path = tmp_path / FILE_NAME
    good = path.stat().st_size
    with open(path, "ab") as f:
        f.write(b"\x30\x00\x00\x00\x01\x02\x03\x04partial")  # a chunk header promising more than exists
    again = RollbackRing(100, tmp_path)
    assert [e.seqno for e in again.entries()] == [1, 2]
    assert path.stat().st_size == good
    again.append(0, 3, b"c")
    assert [e.seqno for e in RollbackRing(100, tmp_path).entries()] == [1, 2, 3]


def test_corrupt_crc_stops_replay(tmp_path):
    ring = RollbackRing(100, tmp_path)
    ring.append(0, 1, b"a")
    ring.append(0, 2, b"b")
    ring.close()
    path = tmp_path / FILE_NAME
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert [e.seqno for e in RollbackRing(100, tmp_path).entries()] == [1]


def test_file_stays_bounded_under_compaction(tmp_path):
    cap = 200
    ring = RollbackRing(cap, tmp_path)
    ring.set_floor(0, 0)
    per_record = 13 + 8  # record header + 8-byte key
    for s in range(1, 5001, 10):
        ring.append_batch(0, list(range(s, s + 10)), [b"key%05d" % i for i in range(s, s + 10)])
        assert len(ring) <= cap
        assert (tmp_path / FILE_NAME).stat().st_size <= (cap * 1.5 + 64) * per_record + 4096
    again = RollbackRing(cap, tmp_path)
    assert again.entries() == ring.entries() and again.floor(0) == 4800


def test_bad_magic_and_bad_capacity(tmp_path):
    (tmp_path / FILE_NAME).write_bytes(b"NOTARING")
    with pytest.raises(StateCorrupt):
        RollbackRing(10, tmp_path)
    with pytest.raises(UsageError):
        RollbackRing(0)


def test_sync_is_cheap_when_clean(tmp_path):
    ring = RollbackRing(10, tmp_path)
    ring.sync()
    ring.append(0, 1, b"a")
    ring.sync()
    ring.close()
    assert os.path.exists(tmp_path / FILE_NAME)
