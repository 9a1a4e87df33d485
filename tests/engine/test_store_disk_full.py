"""A change written straight to disk on a full disk: refused whole with ``DiskFull``, never half-done.

State changes, compactions and promotions commit their own LMDB transaction instead of going
through the write queue, so on a full disk there is nothing queued to persist later: the caller
must learn that nothing changed and may retry.  The data dir sits on a real small tmpfs filled
until ENOSPC (see ``tests.support.small_fs``).
"""
from __future__ import annotations

import errno
from collections.abc import Iterator
from pathlib import Path

import pytest

from engine.core.errors import DiskFull
from engine.storage.store import Store
from tests.support.small_fs import fill, small_tmpfs

BIG = 1 << 20  # more than any free page LMDB may still hold: the commit has to grow the file


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with small_tmpfs(tmp_path / "fs", 8) as where:
        opened = Store.open(where / "data", partitions=2, map_size=1 << 30, failover_cap=8).store
        try:
            yield opened
        finally:
            opened.close()


def test_a_commit_the_full_disk_refuses_is_disk_full_and_changes_nothing(store: Store) -> None:
    def put(value: bytes):
        return lambda txn: txn.put(b"probe", value, db=store.meta_db)

    store.write(put(b"small"))
    filler = fill(Path(store.env.path()).parent)

    with pytest.raises(DiskFull) as refused:
        store.write(put(b"x" * BIG))
    assert refused.value.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO)
    assert refused.value.code == "disk_full" and refused.value.retriable
    assert "nothing changed" in refused.value.message
    with store.read_txn() as txn:
        assert txn.get(b"probe", db=store.meta_db) == b"small"

    filler.unlink()
    store.write(put(b"y" * BIG))
    with store.read_txn() as txn:
        assert txn.get(b"probe", db=store.meta_db) == b"y" * BIG
