"""The chunked ring against a plain list model, over random operations, with reloads from disk."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clients.ring import RingEntry, RollbackRing

ops = st.lists(st.one_of(
    st.tuples(st.just("batch"), st.integers(0, 2), st.integers(1, 6)),
    st.tuples(st.just("drop"), st.integers(0, 2), st.integers(0, 40)),
    st.tuples(st.just("reset"), st.integers(0, 2), st.just(0)),
    st.tuples(st.just("reload"), st.just(0), st.just(0)),
), max_size=40)


class Model:
    def __init__(self, cap: int) -> None:
        self.cap, self.entries, self.floors = cap, [], {}

    def add(self, p: int, seqnos: list[int], keys: list[bytes]) -> None:
        if p not in self.floors:
            self.floors[p] = max(seqnos[0] - 1, 0)
        for s, k in zip(seqnos, keys):
            self.entries.append(RingEntry(p, s, k))
            if len(self.entries) > self.cap:
                old = self.entries.pop(0)
                self.floors[old.partition] = max(self.floors.get(old.partition, 0), old.seqno)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cap=st.integers(1, 12), program=ops)
def test_ring_matches_model(tmp_path_factory, cap, program):
    d = tmp_path_factory.mktemp("ring")
    ring = RollbackRing(cap, d)
    model = Model(cap)
    next_seqno = {0: 1, 1: 1, 2: 1}
    for op, p, arg in program:
        if op == "batch":
            seqnos = list(range(next_seqno[p], next_seqno[p] + arg))
            next_seqno[p] += arg + 1  # gaps, as deduplication leaves
            keys = [b"k%d-%d" % (p, s % 7) for s in seqnos]
            ring.append_batch(p, seqnos, keys)
            model.add(p, seqnos, keys)
        elif op == "drop":
            ring.drop_above(p, arg)
            model.entries = [e for e in model.entries if not (e.partition == p and e.seqno > arg)]
            next_seqno[p] = max(min(next_seqno[p], arg + 1), max([e.seqno for e in model.entries
                                                                if e.partition == p], default=0) + 1)
        elif op == "reset":
            ring.reset(p)
            model.entries = [e for e in model.entries if e.partition != p]
            model.floors[p] = 0
            next_seqno[p] = 1
        else:
            ring.close()
            ring = RollbackRing(cap, d)
        assert ring.entries() == model.entries
        assert len(ring) == len(model.entries) <= cap
        for q in range(3):
            assert ring.floor(q) == model.floors.get(q)
            for r in (0, 3, 10):
                assert ring.keys_above(q, r) == list(dict.fromkeys(e.key for e in model.entries
                                                                   if e.partition == q and e.seqno > r))
    ring.close()
