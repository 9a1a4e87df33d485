"""The write queue against a plain model (Hypothesis state machine), without LMDB.

Model: the full history of versions by seqno and the persisted seqno.  After any sequence of
write batches and (partial) flushes, the queue must satisfy what snapshots and the flusher
rely on: the unpersisted range of the root holds exactly each key's latest version once, the
index holds exactly the unpersisted latest versions, byte accounting matches, and roots taken
earlier never change."""
from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from engine.core.types import Item
from engine.writequeue import ITEM_OVERHEAD, WriteQueue

KEYS = st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])


class QueueMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.queue = WriteQueue(0)
        self.history: dict[int, Item] = {}
        self.pinned: list[tuple[object, list[Item]]] = []

    @rule(keys=st.lists(KEYS, min_size=1, max_size=8))
    def write_batch(self, keys: list[bytes]) -> None:
        batch = self.queue.begin()
        for key in keys:
            prev = self.queue.index.get(key)
            item = Item(key, batch.next_seqno, batch.next_seqno, (prev.rev if prev else 0) + 1, False, b"x" * len(keys))
            self.history[item.seqno] = item
            batch.add(item, prev)
        batch.publish()

    @rule(limit=st.integers(min_value=1, max_value=12))
    def flush(self, limit: int) -> None:
        items, upto = self.queue.unpersisted(limit)
        expected = self._latest(self.queue.persisted + 1, upto)
        assert items == expected
        self.queue.mark_persisted(items, upto)

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
        assert root.persisted == self.queue.persisted and root.base <= root.persisted + 1

    @invariant()
    def pinned_roots_never_change(self) -> None:
        for root, content in self.pinned:
            assert list(root.items(root.persisted + 1, root.high)) == content  # type: ignore[attr-defined]


QueueMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestWriteQueueModel = QueueMachine.TestCase
