"""Consumer processes: the reading side of every workload, in a process of its own.

``python -m bench.suite.child '<json>'`` imports a system's stream module, reads its feed and
prints one ``RESULT {json}`` line. Modes:

* ``backfill``: read ``n`` documents from the beginning; report the time from opening the stream
  to the n-th document (connection and subscription included).
* ``tail``: subscribe at "now", print ``READY``, record the receipt time of each document by its
  sequence number into a binary file (``array('q')``, -1 = never received) that the suite joins
  with its write-ack times.
* ``fanout``: ``consumers`` independent subscriptions in this process; each keeps the lag from the
  send time stamped in the document to its receipt.

Stdin carries one control line from the suite: ``END <written> <t_start_ns> <t_end_ns>`` when the
writer is done; the consumer then drains until it has ``written`` documents or ``grace_s`` passes.
Times are ``time.monotonic_ns()``, one clock for every process on the machine (CLOCK_MONOTONIC).

:class:`ConsumerProcess` is the suite's handle on such a process.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from array import array
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from bench.suite.docs import doc_index, doc_sent_ns
from bench.suite.stats import percentiles

# ----------------------------------------------------------------------------- consumer side


class _Control:
    """The END line from stdin, delivered into the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.ended = asyncio.Event()
        self.written = -1
        self.t_start_ns = 0
        self.t_end_ns = 0
        self._loop = loop
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            parts = line.split()
            if parts and parts[0] == "END":
                self._loop.call_soon_threadsafe(self._end, [int(p) for p in parts[1:4]])
                return

    def _end(self, values: list[int]) -> None:
        _log(f"END {values}")
        self.written, self.t_start_ns, self.t_end_ns = values
        self.ended.set()


def _emit(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def _first_ready(stream: AsyncIterator[list[Any]]) -> None:
    """Wait for the ``[]`` a stream yields once subscribed (documents before it are a bug)."""
    first = await stream.__anext__()
    if first:
        raise RuntimeError("stream yielded documents before signalling it was subscribed")


async def _drain(task: asyncio.Future[Any], ctl: _Control, is_done: Callable[[], bool], grace_s: float,
                 all_in: Callable[[], bool]) -> None:
    """Let ``task`` run until the writer ended and ``is_done()`` (or ``grace_s`` passed), then stop it.

    ``all_in()`` (everything the writer planned has arrived) also ends it, END line or not.
    """
    while not ctl.ended.is_set() and not all_in() and not task.done():
        await asyncio.sleep(0.01)
    _log(f"writer ended={ctl.ended.is_set()} written={ctl.written} all_in={all_in()}")
    deadline = time.monotonic() + grace_s
    while not is_done() and not all_in() and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.01)
    _log(f"drained done={is_done()} all_in={all_in()}")
    task.cancel()
    await _bounded(asyncio.gather(task, return_exceptions=True))


async def _bounded(aw: Any, seconds: float = 2.0) -> None:
    """Await a cancellation or a close, but never longer than ``seconds``: a client library that
    hangs while closing must not hold the figures hostage (the process exits right after)."""
    try:
        await asyncio.wait_for(aw, seconds)
    except (Exception, asyncio.CancelledError):  # noqa: BLE001
        pass


def _log(message: str) -> None:
    print(f"{time.monotonic():.3f} {message}", file=sys.stderr, flush=True)


async def run_backfill(open_stream: Any, conn: dict[str, Any], n: int, timeout_s: float) -> dict[str, Any]:
    cpu0 = time.process_time()
    t0 = time.monotonic()
    stream = open_stream(conn, "beginning", 0)
    await _first_ready(stream)
    t_ready = time.monotonic()
    count = 0
    last_index = -1
    deadline = t0 + timeout_s
    try:
        async for docs in stream:
            if docs:
                count += len(docs)
                last_index = doc_index(docs[-1])
            if count >= n or time.monotonic() > deadline:
                break
    finally:
        t_end = time.monotonic()
        await _bounded(stream.aclose())
    return {
        "received": count,
        "last_index": last_index,
        "seconds": t_end - t0,
        "subscribe_seconds": t_ready - t0,
        "timed_out": count < n,
        "cpu_s": time.process_time() - cpu0,
    }


async def run_tail(open_stream: Any, conn: dict[str, Any], capacity: int, out: str, grace_s: float,
                   timeout_s: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ctl = _Control(loop)
    recv = array("q", [-1]) * capacity
    stream = open_stream(conn, "now", 0)
    await _first_ready(stream)
    cpu0 = time.process_time()
    _emit("READY")

    state: dict[str, Any] = {"count": 0, "dups": 0, "outside": 0}

    def record(docs: list[Any]) -> None:
        now = time.monotonic_ns()
        for d in docs:
            i = doc_index(d)
            if 0 <= i < capacity:
                if recv[i] < 0:
                    recv[i] = now
                    state["count"] += 1
                else:
                    state["dups"] += 1
            else:
                state["outside"] += 1

    async def consume() -> None:
        try:
            async for docs in stream:
                if docs:
                    record(docs)
        except Exception as exc:  # noqa: BLE001 - reported as the result
            state["error"] = f"{type(exc).__name__}: {exc}"

    task = asyncio.create_task(consume())
    try:
        await asyncio.wait_for(_drain(task, ctl, lambda: state["count"] >= ctl.written, grace_s,
                                      lambda: state["count"] >= capacity), timeout_s)
    except TimeoutError:
        pass
    task.cancel()
    await _bounded(asyncio.gather(task, return_exceptions=True))
    await _bounded(stream.aclose())
    state["cpu_s"] = time.process_time() - cpu0
    Path(out).write_bytes(recv.tobytes())
    return state


async def run_fanout(open_stream: Any, conn: dict[str, Any], consumers: int, first_ident: int, planned: int,
                     grace_s: float, timeout_s: float) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    ctl = _Control(loop)
    streams = [open_stream(conn, "now", first_ident + k) for k in range(consumers)]
    await asyncio.gather(*(_first_ready(s) for s in streams))
    cpu0 = time.process_time()
    _emit("READY")
    lags = [array("q") for _ in range(consumers)]
    last_recv = [0] * consumers
    reads = [0] * consumers  # batches handed over by the feed (upr: WebSocket messages with documents)

    errors: list[str] = []

    async def consume(k: int) -> None:
        lag = lags[k]
        try:
            async for docs in streams[k]:
                if not docs:
                    continue
                now = time.monotonic_ns()
                lag.extend(now - doc_sent_ns(d) for d in docs)
                last_recv[k] = now
                reads[k] += 1
        except Exception as exc:  # noqa: BLE001 - reported as the result
            errors.append(f"consumer {k}: {type(exc).__name__}: {exc}")

    tasks = [asyncio.create_task(consume(k)) for k in range(consumers)]
    gathered = asyncio.gather(*tasks)
    try:
        await asyncio.wait_for(
            _drain(gathered, ctl, lambda: all(len(lag) >= ctl.written for lag in lags), grace_s,
                   lambda: all(len(lag) >= planned for lag in lags)), timeout_s
        )
    except TimeoutError:
        pass
    for t in tasks:
        t.cancel()
    await _bounded(asyncio.gather(*tasks, return_exceptions=True))
    await _bounded(asyncio.gather(*(s.aclose() for s in streams), return_exceptions=True))
    per = []
    for k in range(consumers):
        p = percentiles([v / 1e6 for v in lags[k]], (50, 99, 100)) if lags[k] else {}
        per.append({"received": len(lags[k]), "last_recv_ns": last_recv[k], "lag_ms": p, "reads": reads[k]})
    res = {"consumers": per, "cpu_s": time.process_time() - cpu0, "written": ctl.written,
           "t_start_ns": ctl.t_start_ns, "t_end_ns": ctl.t_end_ns}
    if errors:
        res["error"] = "; ".join(errors[:3])
    return res


async def _main(args: dict[str, Any]) -> dict[str, Any]:
    module = importlib.import_module(args["module"])
    open_stream = module.open_stream
    mode = args["mode"]
    if mode == "backfill":
        return await run_backfill(open_stream, args["conn"], args["n"], args["timeout_s"])
    if mode == "tail":
        return await run_tail(open_stream, args["conn"], args["capacity"], args["out"], args["grace_s"],
                              args["timeout_s"])
    if mode == "fanout":
        return await run_fanout(open_stream, args["conn"], args["consumers"], args["first_ident"], args["planned"],
                                args["grace_s"], args["timeout_s"])
    raise ValueError(f"unknown mode {mode!r}")


def main() -> None:
    args = json.loads(sys.argv[1])
    try:
        result = asyncio.run(_main(args))
    except BaseException as exc:  # noqa: BLE001 - reported to the suite, which shows it in the table
        _emit("RESULT " + json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        sys.stdout.flush()
        os._exit(1)
    _emit("RESULT " + json.dumps(result))
    sys.stdout.flush()
    os._exit(0)  # do not wait on client library threads: the suite has what it needs


# ----------------------------------------------------------------------------- suite side


class ConsumerError(RuntimeError):
    pass


class ConsumerProcess:
    """One consumer process started through the suite's ProcessGroup, driven over stdin/stdout."""

    def __init__(self, procs: Any, module: str, conn: dict[str, Any], mode: str, log: Path,
                 **params: Any) -> None:
        args = {"module": module, "conn": conn, "mode": mode, **params}
        self.log = log
        self._procs = procs
        self.proc = procs.spawn(
            [sys.executable, "-m", "bench.suite.child", json.dumps(args)],
            name=f"consumer-{mode}", log=log, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode(errors="replace").rstrip("\n"))
        self._lines.put(None)

    async def _line(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ConsumerError(f"no {prefix!r} from consumer within {timeout:.0f}s ({_tail(self.log)})")
            try:
                line = await asyncio.to_thread(self._lines.get, True, min(left, 0.5))
            except queue.Empty:
                continue
            if line is None:
                raise ConsumerError(f"consumer exited before {prefix!r}: {_tail(self.log)}")
            if line.startswith("RESULT ") and prefix != "RESULT":
                raise ConsumerError(f"consumer failed: {json.loads(line[7:]).get('error', line)}")
            if line.startswith(prefix):
                return line

    async def ready(self, timeout: float) -> None:
        await self._line("READY", timeout)

    def end(self, written: int, t_start_ns: int, t_end_ns: int) -> None:
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(f"END {written} {t_start_ns} {t_end_ns}\n".encode())
            self.proc.stdin.flush()
        except BrokenPipeError:
            pass

    async def result(self, timeout: float) -> dict[str, Any]:
        try:
            line = await self._line("RESULT", timeout)
        finally:
            self._procs.stop(self.proc, timeout=5)
        res: dict[str, Any] = json.loads(line[len("RESULT ") :])
        if "error" in res:
            raise ConsumerError(f"consumer failed: {res['error']}")
        return res


def _tail(log: Path) -> str:
    try:
        lines = log.read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return " | ".join(lines[-3:]) or "empty log"


if __name__ == "__main__":
    main()
