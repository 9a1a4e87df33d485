"""State and ring files survive SIGKILL at any instant: never half-written, always loadable."""
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from clients.ring import RollbackRing
from clients.state import FileStateStore

pytestmark = pytest.mark.slow

WRITER = textwrap.dedent("""
    import sys
    from clients.ring import RollbackRing
    from clients.state import ConsumerState, FileStateStore, PartitionCheckpoint
    from engine.core.types import FailoverEntry
    from engine.protocol.client.offset import StreamOffset
    d = sys.argv[1]
    store = FileStateStore(d)
    ring = RollbackRing(500, d)
    st = store.load()
    seqno = next(iter(st.partitions.values())).offset.seqno if st else 0
    print("ready", flush=True)
    while True:
        seqno += 1
        ring.append_batch(seqno % 7, [seqno] * 3, [b"key-%d" % seqno] * 3)
        ring.sync()
        parts = {p: PartitionCheckpoint(StreamOffset(p + 1, seqno, seqno, seqno),
                                        tuple(FailoverEntry(u + 1, 0) for u in range(30)))
                 for p in range(64)}
        store.save(ConsumerState(parts, "node", 64))
""")


def test_kill_during_save_never_leaves_a_half_written_file(tmp_path):
    rng = random.Random(7)
    last = 0
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                                cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
        assert proc.stdout.readline() == b"ready\n"
        time.sleep(rng.uniform(0.01, 0.15))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        store = FileStateStore(tmp_path)
        state = store.load()  # raises StateCorrupt on a torn file
        store.close()
        if state is not None:
            seqnos = {cp.offset.seqno for cp in state.partitions.values()}
            assert len(seqnos) == 1 and len(state.partitions) == 64
            assert seqnos.pop() >= last  # never goes back
            last = next(iter(state.partitions.values())).offset.seqno
        ring = RollbackRing(500, tmp_path)
        assert len(ring) <= 500
        entries = ring.entries()
        if entries:
            # the ring is synced before each save, so it holds everything the state claims
            assert max(e.seqno for e in entries) >= last
        ring.close()
    assert last > 0
