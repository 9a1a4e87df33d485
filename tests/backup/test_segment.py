"""Segment format: round trips, and every kind of damage located by file and offset."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import pytest

from clients.backup.errors import CorruptArchive
from clients.backup.segment import (
    BLOCK_HEADER_SIZE,
    FILE_HEADER_SIZE,
    SegmentReader,
    SegmentWriter,
    SnapshotMarker,
)
from engine.core.types import Item
from engine.protocol.client.offset import StreamOffset


def _items(n: int, start: int = 1) -> list[Item]:
    out = []
    for s in range(start, start + n):
        deleted = s % 5 == 0
        value = b"" if deleted else (b"x" * (s % 40) + os.urandom(s % 7))
        out.append(Item(f"key-{s}".encode(), s, 1000 + s, s % 3 + 1, deleted, value))
    return out


def _write(path: Path, items: list[Item], block_bytes: int = 256) -> None:
    w = SegmentWriter(path, 3, block_bytes=block_bytes)
    w.snapshot(1, items[-1].seqno, "disk")
    w.add_many(items)
    w.close()


def test_round_trip_across_many_blocks(tmp_path: Path) -> None:
    items = _items(500)
    path = tmp_path / "p0003.seg"
    w = SegmentWriter(path, 3, block_bytes=256)
    w.snapshot(1, 250, "disk")
    w.add_many(items[:250])
    w.snapshot(251, 500, "memory")
    for it in items[250:]:
        w.add(it)
    s = w.close()
    assert s.blocks > 10
    assert (s.mutations, s.deletions, s.snapshots) == (400, 100, 2)
    assert (s.first_seqno, s.last_seqno, s.bytes) == (1, 500, path.stat().st_size)
    records = list(SegmentReader(path, partition=3).records())
    assert records[0] == SnapshotMarker(1, 250, "disk")
    assert records[251] == SnapshotMarker(251, 500, "memory")
    got = [r for r in records if isinstance(r, Item)]
    assert got == items


def test_incompressible_payload_is_stored_raw(tmp_path: Path) -> None:
    items = [Item(b"k", 1, 1, 1, False, os.urandom(4000))]
    _write(tmp_path / "s", items, block_bytes=1 << 20)
    assert list(SegmentReader(tmp_path / "s").items()) == items


def test_writer_refuses_seqnos_out_of_order(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path / "s", 0)
    w.add(Item(b"a", 5, 1, 1, False, b""))
    with pytest.raises(ValueError, match="seqno 5 after 5"):
        w.add(Item(b"b", 5, 1, 1, False, b""))
    w.abort()
    assert not (tmp_path / "s").exists()


def test_wrong_partition_is_reported(tmp_path: Path) -> None:
    _write(tmp_path / "s", _items(3))
    with pytest.raises(CorruptArchive, match="belongs to partition 3, expected 4"):
        list(SegmentReader(tmp_path / "s", partition=4).records())


def _block_offsets(path: Path) -> list[int]:
    data = path.read_bytes()
    offsets, pos = [], FILE_HEADER_SIZE
    while pos < len(data):
        offsets.append(pos)
        (stored,) = struct.unpack_from("<I", data, pos + 4)
        pos += BLOCK_HEADER_SIZE + stored
    return offsets


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("file_header", "bad file header"),
        ("block_header", "bad block header"),
        ("payload", "payload checksum mismatch"),
        ("truncate_payload", "truncated block payload"),
        ("truncate_header", "truncated block header"),
    ],
)
def test_damage_is_located_by_file_and_offset(tmp_path: Path, where: str, message: str) -> None:
    path = tmp_path / "p0003.seg"
    _write(path, _items(300))
    offsets = _block_offsets(path)
    victim = offsets[len(offsets) // 2]
    data = bytearray(path.read_bytes())
    expected_offset = victim
    if where == "file_header":
        data[2] ^= 0xFF
        expected_offset = 0
    elif where == "block_header":
        data[victim + 9] ^= 0x01
    elif where == "payload":
        data[victim + BLOCK_HEADER_SIZE + 3] ^= 0x40
    elif where == "truncate_payload":
        del data[victim + BLOCK_HEADER_SIZE + 2 :]
    elif where == "truncate_header":
        del data[victim + 10 :]
    path.write_bytes(bytes(data))
    reader = SegmentReader(path, partition=3, display="runs/r1/p0003.seg")
    with pytest.raises(CorruptArchive) as info:
        list(reader.records())
    err = info.value
    assert message in str(err)
    assert err.offset == expected_offset
    assert err.path == "runs/r1/p0003.seg"
    assert f"runs/r1/p0003.seg at offset {expected_offset}" in str(err)
    assert err.partition == 3


def test_blocks_before_the_damage_stay_readable(tmp_path: Path) -> None:
    path = tmp_path / "s"
    items = _items(300)
    _write(path, items)
    offsets = _block_offsets(path)
    data = bytearray(path.read_bytes())
    data[offsets[-1] + BLOCK_HEADER_SIZE] ^= 0xFF
    path.write_bytes(bytes(data))
    got: list[Item] = []
    with pytest.raises(CorruptArchive):
        for r in SegmentReader(path).items():
            got.append(r)
    assert got and got == items[: len(got)]


@pytest.mark.parametrize(("level", "background"), [(0, False), (1, False), (9, False), (1, True)])
def test_every_level_round_trips(tmp_path: Path, level: int, background: bool) -> None:
    items = _items(200)
    w = SegmentWriter(tmp_path / "s", 3, block_bytes=1024, level=level, background=background)
    w.add_many(items)
    s = w.close()
    assert list(SegmentReader(tmp_path / "s").items()) == items
    if level == 0:  # stored: the file is the raw records plus headers
        assert s.bytes > sum(31 + len(i.key) + len(i.value) for i in items)


def test_a_marker_that_brought_no_items_is_replaced(tmp_path: Path) -> None:
    w = SegmentWriter(tmp_path / "s", 0)
    w.snapshot(1, 10, "disk")
    w.snapshot(1, 10, "disk")  # re-announced after a reconnect
    w.add(Item(b"k", 4, 1, 1, False, b"v"))
    assert w.close().snapshots == 1
    assert list(SegmentReader(tmp_path / "s").records()) == [SnapshotMarker(1, 10, "disk"), Item(b"k", 4, 1, 1, False, b"v")]


def test_a_checkpoint_is_a_stream_offset_in_the_documented_record_layout(tmp_path: Path) -> None:
    """The checkpoint record keeps its on-disk layout (kind 3, seqno, cas = uuid, rev = snap_start,
    value = u64 snap_end), so archives written before and after read the same."""
    path = tmp_path / "p0003.seg"
    w = SegmentWriter(path, 3)
    w.snapshot(1, 9, "disk")
    w.add_many(_items(4))
    w.checkpoint(StreamOffset(0xABCD, 4, 1, 9))
    w.close()
    reader = SegmentReader(path, partition=3)
    [(_info, raw)] = list(reader.blocks())
    expected = struct.pack("<BQQQHI", 3, 4, 0xABCD, 1, 0, 8) + struct.pack("<Q", 9)
    assert raw.endswith(expected)
    assert list(reader.records())[-1] == StreamOffset(0xABCD, 4, 1, 9)


def test_a_checkpoint_that_is_no_position_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "p0003.seg"
    w = SegmentWriter(path, 3)
    w.snapshot(1, 9, "disk")
    w.add_many(_items(4))
    # snap_start 5 above seqno 4: no valid writer produces it, a damaged or crafted file may
    w._append(struct.pack("<BQQQHI", 3, 4, 7, 5, 0, 8) + struct.pack("<Q", 9), None)
    w.close()
    with pytest.raises(CorruptArchive, match="checkpoint record is not a position"):
        list(SegmentReader(path, partition=3).records())
