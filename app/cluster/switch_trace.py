"""Stamps of a handover's switch transaction end to end, for the rebalance benchmark.

Off unless the node's environment sets ``UPR_SWITCH_TRACE=1``; then the node samples its own
event loop's lag (a short sleep's overshoot), records every cyclic-GC collection of its process,
logs each loop stall over ``LOG_STALL_S`` with the loop thread's innermost frames and kernel
state sampled while it lasts, and each switch transaction the node sends as a handover's source
is stamped at every step: handed to the client, taken up by the connection (``acquired``), the
request written, the answer's headers read, its body read, and the coroutine resumed in the
source's fence.  The fence logs one ``switch trace`` line per transaction with these and with
the loop stalls and collections that overlapped it (``bench.cluster_phases.switch_traces``).
All stamps are ``time.monotonic()``: the host's clock, one for every process of the bench.

WHY: a handover's pause is mostly its switch transaction, and the slow ones (a few hundred ms
on an etcd without fsync, where most take tens) could be the source's loop, its GC, the etcd
client's connection pool, or etcd; only stamps on each side of each step say which
(docs/benchmarks.md, Cluster: "The switch transaction off the event loop").
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

TRACE_ENV = "UPR_SWITCH_TRACE"

#: the sampler's sleep: short enough to see a stall of a few ms, long enough to cost little
SAMPLE_S = 0.005
#: overshoots of the sleep kept as stalls (smaller ones are timer granularity)
STALL_S = 0.005
#: stalls logged one by one, with their start on the host's clock: a handover's target can be
#: the node whose loop holds the pause (its watch brings the map), and only its log says so
LOG_STALL_S = 0.05

#: how often a stalled loop's stack is sampled, and how many of its innermost frames are logged
WATCH_S = 0.02
STACK_DEPTH = 8

log = logging.getLogger("upr.cluster")

class RequestStamps:
    """One request's stamps, marked by the client that sends it (``EtcdThread``)."""

    def __init__(self) -> None:
        self.handed = time.monotonic()
        self.marks: dict[str, float] = {}
        #: set by a client that had to open a connection for this request
        self.connected_new = False

    def mark(self, name: str) -> None:
        """A step reached (a client that stamps its own steps: ``acquired``, ``sent``, ...)."""
        self.marks.setdefault(name, time.monotonic())


class SwitchTrace:
    """The node's loop stalls and GC collections (recent ones), and the text of one request's
    stamps beside them."""

    def __init__(self) -> None:
        #: (stall start, stall end) of the event loop, seconds
        self.stalls: deque[tuple[float, float]] = deque(maxlen=4096)
        #: (start, end, generation) of every collection
        self.collections: deque[tuple[float, float, int]] = deque(maxlen=4096)
        self._gc_start = 0.0
        self._task: asyncio.Task[None] | None = None
        self._loop_thread = self._loop_native = 0
        self._beat = 0.0

    @classmethod
    def from_env(cls) -> SwitchTrace | None:
        return cls() if os.environ.get(TRACE_ENV) == "1" else None

    def start(self) -> None:
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.get_running_loop().create_task(self._sample())
        self._loop_thread = threading.get_ident()
        self._loop_native = threading.get_native_id()
        self._beat = time.monotonic()
        threading.Thread(target=self._watch_stalls, name="stall sampler", daemon=True).start()

    def _watch_stalls(self) -> None:
        """While the loop is stalled past ``LOG_STALL_S``, log what the loop's thread is running
        every ``WATCH_S`` (its innermost frames): which callback holds the loop."""
        while self._task is not None and not self._task.done():
            time.sleep(WATCH_S)
            if time.monotonic() - self._beat < LOG_STALL_S:
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            stack = traceback.extract_stack(frame)[-STACK_DEPTH:]
            log.warning("loop stall sample: [%s] %s", _thread_state(self._loop_native), " < ".join(
                f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in reversed(stack)))

    async def aclose(self) -> None:
        if self._on_gc in gc.callbacks:
            gc.callbacks.remove(self._on_gc)
        if self._task is not None:
            self._task.cancel()

    def _on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_start = time.monotonic()
        else:
            self.collections.append((self._gc_start, time.monotonic(), info["generation"]))

    async def _sample(self) -> None:
        while True:
            due = time.monotonic() + SAMPLE_S
            await asyncio.sleep(SAMPLE_S)
            woke = self._beat = time.monotonic()
            if woke - due > STALL_S:
                self.stalls.append((due, woke))
                if woke - due > LOG_STALL_S:
                    log.warning("loop stalled %.0f ms from %.6f (monotonic)", (woke - due) * 1000, due)

    def describe(self, stamps: RequestStamps, resumed: float) -> str:
        """``handed->acquired 0 ms, ->sent 1 ms, ...; loop stalled 0 ms (max 0 ms); gc ...``:
        each step's milliseconds, then what of the node overlapped the whole request."""
        steps, last = [], stamps.handed
        for name in ("acquired", "sent", "answered", "read"):
            at = stamps.marks.get(name)
            if at is None:
                steps.append(f"{name} ?")
                continue
            steps.append(f"{name} {(at - last) * 1000:.0f} ms")
            last = at
        steps.append(f"resumed {(resumed - last) * 1000:.0f} ms")
        lo, hi = stamps.handed, resumed
        stalled = [min(e, hi) - max(s, lo) for s, e in self.stalls if e > lo and s < hi]
        gcs = [(min(e, hi) - max(s, lo), g) for s, e, g in self.collections if e > lo and s < hi]
        gc_text = ", ".join(f"gen{g} {d * 1000:.0f} ms" for d, g in gcs) or "none"
        return (f"{', '.join(steps)}; total {(hi - lo) * 1000:.0f} ms"
                f"{' on a new connection' if stamps.connected_new else ''}; "
                f"loop stalled {sum(stalled) * 1000:.0f} ms (longest {max(stalled, default=0) * 1000:.0f} ms); "
                f"gc {gc_text}")


def _thread_state(native_id: int) -> str:
    """The kernel's state of a thread of this process: R running or runnable (a core is what it
    lacks, or it runs C code), S sleeping (on a lock such as the GIL, or polling)."""
    try:
        with open(f"/proc/self/task/{native_id}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0].decode()
    except OSError:
        return "?"


async def traced(trace: SwitchTrace | None, call: Callable[[RequestStamps | None], Awaitable[Any]],
                 ) -> tuple[Any, str | None]:
    """``call`` with stamps when tracing is on; its result and the stamps' text (None when off)."""
    if trace is None:
        return await call(None), None
    stamps = RequestStamps()
    result = await call(stamps)
    return result, trace.describe(stamps, time.monotonic())
