"""The write queue against a plain model (Hypothesis state machine), driven by the code
production runs: writes go through ``BatchWriter.write`` (the ``Engine.write_batch`` path) and
flushes through ``Flusher.flush_round``, over a real ``Store`` in a temporary directory.

Model: the full history of versions by seqno and the persisted seqno.  After any sequence of
write batches and (partial) flushes, the queue must satisfy what snapshots and the flusher
rely on: the unpersisted range of the root holds exactly each key's latest version once, the
index holds exactly the unpersisted latest versions, byte accounting matches, and roots taken
earlier never change.  Each write's rev counts the key's versions (queue or disk), CAS only
grows, and the live-item count matches the model."""
from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from engine.batch_writer import BatchWriter
from engine.core.types import Item, Op, PartitionState, WriteResult
from engine.flusher import Flusher, lmdb_turn
from engine.partition import Partition
from engine.storage.store import Store
from engine.writequeue import ITEM_OVERHEAD, QueueBytes, WriteQueue

KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f"])


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.dir = Path(tempfile.mkdtemp(prefix="upr-queue-model-"))
        self.store = Store.open(self.dir, 1, 1 << 24, 25).store
        self.part = Partition(id=0, state=PartitionState.ACTIVE, failover_log=(), purge_seqno=0, live_items=0,
                              persisted_live=0, queue=WriteQueue(0))
        self.queue = self.part.queue
        self.total = QueueBytes()  # what an engine's backpressure check reads
        self.queue.count_in(self.total)
        self.lock = threading.RLock()
        self.turn = lmdb_turn()
        self.writer = BatchWriter([self.part], self.store, self.turn, max_key_bytes=250, max_value_bytes=1 << 20)
        self.clock = 1_000
        self.history: dict[int, Item] = {}
        self.live: set[bytes] = set()
        self.pinned: list[tuple[object, list[Item]]] = []

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    @rule(keys=st.lists(st.tuples(KEYS, st.booleans()), min_size=1, max_size=8),
          clock_step=st.integers(min_value=-5, max_value=5))
    def write_batch(self, keys: list[tuple[str, bool]], clock_step: int) -> None:
        self.clock += clock_step  # the clock may step back: CAS must still grow
        ops = [(Op.DELETION if delete else Op.MUTATION, key, b"" if delete else b"x" * len(keys), None)
               for key, delete in keys]
        before = self.writer.last_cas
        with self.lock:
            results, written = self.writer.write(ops, self.clock)
        cas_seen = [before]
        for (key, delete), result in zip(keys, results):
            raw = key.encode()
            if delete and raw not in self.live:
                assert not isinstance(result, WriteResult)  # KeyNotFound, and nothing queued
                continue
            assert isinstance(result, WriteResult)
            versions = sum(1 for item in self.history.values() if item.key == raw)
            assert result.rev == versions + 1
            cas_seen.append(result.cas)
            self.history[result.seqno] = Item(raw, result.seqno, result.cas, result.rev, delete,
                                              b"" if delete else b"x" * len(keys))
            (self.live.discard if delete else self.live.add)(raw)
        assert cas_seen == sorted(set(cas_seen)) and self.writer.last_cas == cas_seen[-1]
        assert written == ([0] if len(cas_seen) > 1 else [])
        assert self.part.live_items == len(self.live)

    @precondition(lambda self: self.queue.root.high > self.queue.persisted)
    @rule(limit=st.integers(min_value=1, max_value=12))
    def flush(self, limit: int) -> None:
        upto = min(self.queue.root.high, self.queue.persisted + limit)
        expected = self._latest(self.queue.persisted + 1, upto)
        items, _ = self.queue.unpersisted(limit)
        assert items == expected
        flusher = Flusher(self.store, [self.part], self.lock, interval_s=1.0, batch_items=limit, turn=self.turn)
        flusher.flush_round()
        assert self.queue.persisted == upto
        with self.store.read_txn() as txn:
            assert self.store.persisted_seqno(txn, 0) == upto

    @rule()
    def pin(self) -> None:
        root = self.queue.root
        self.pinned.append((root, list(root.items(root.persisted + 1, root.high))))

    def _latest(self, start: int, end: int) -> list[Item]:
        """Versions in [start, end] not superseded by any later write.

        Anything above the persisted seqno was unpersisted when its key was rewritten (the
        persisted seqno only grows), so the rewrite cleared its slot: dedup is exact there."""
        high = self.queue.root.high
        later_keys: set[bytes] = set()
        superseded: set[int] = set()
        for seqno in range(high, start - 1, -1):
            key = self.history[seqno].key
            if key in later_keys:
                superseded.add(seqno)
            later_keys.add(key)
        return [self.history[s] for s in range(start, end + 1) if s not in superseded]

    @invariant()
    def unpersisted_range_holds_latest_versions_once(self) -> None:
        root = self.queue.root
        items = list(root.items(root.persisted + 1, root.high))
        assert len({i.key for i in items}) == len(items)
        assert items == self._latest(root.persisted + 1, root.high)

    @invariant()
    def index_and_bytes_match(self) -> None:
        root = self.queue.root
        latest = self._latest(root.persisted + 1, root.high)
        assert self.queue.index == {i.key: i for i in latest}
        assert self.queue.bytes == sum(len(i.key) + len(i.value) + ITEM_OVERHEAD for i in latest)
        assert self.total.bytes == self.queue.bytes
        assert root.persisted == self.queue.persisted and root.base <= root.persisted + 1

    @invariant()
    def pinned_roots_never_change(self) -> None:
        for root, content in self.pinned:
            assert list(root.items(root.persisted + 1, root.high)) == content  # type: ignore[attr-defined]


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestWriteQueueModel = QueueMachine.TestCase
