"""The four feed workloads, written once against :class:`~bench.suite.adapter.System`.

1. ingest: ``ingest_n`` documents in batches of ``batch``, each batch acknowledged before the next.
2. backfill: ``backfill_n`` documents stored, then read from the beginning by a consumer process.
3. tail: a consumer process subscribed at "now"; the writer paces small batches at a fixed rate and
   records when each batch was acknowledged; latency = consumer receipt - write ack, per document
   (receipt before the ack counts as 0, and the share of such documents is reported).
4. fan-out: many consumers (spread over a few processes) tail while the writer keeps a fixed rate;
   delivered/s over the window, and the lag send-stamp -> receipt of the worst consumer.
"""

from __future__ import annotations

import asyncio
import os
import time
from array import array
from dataclasses import dataclass
from pathlib import Path

from bench.suite.adapter import System, Writer
from bench.suite.child import ConsumerError, ConsumerProcess
from bench.suite.docs import batch, key_of, make_doc
from bench.suite.procs import ProcessGroup
from bench.suite.results import Row
from bench.suite.sizes import Sizes
from bench.suite.stats import percentiles, rate

LATENCY_PS = (50, 90, 99, 99.9)


def _cpu(metrics: dict[str, float], wall: float, server: float, writer: float | None = None,
         consumer: float | None = None) -> str:
    """Record CPU seconds per wall second of each side; return the detail text for them.

    A side near 1.0 was CPU-bound on one core: that is where the time went."""
    parts = [("server", server), ("writer", writer), ("consumer", consumer)]
    out = []
    for name, cpu in parts:
        if cpu is None:
            continue
        metrics[f"{name}_cpu_per_s"] = cpu / wall if wall > 0 else 0.0
        out.append(f"{name} {cpu / wall:.2f}" if wall > 0 else f"{name} ?")
    return "CPU/wall " + ", ".join(out)


@dataclass
class Ctx:
    procs: ProcessGroup
    workdir: Path
    sizes: Sizes


async def ingest(system: System, ctx: Ctx) -> list[Row]:
    n, size = ctx.sizes.ingest_n, ctx.sizes.batch
    batches = [batch(first, min(size, n - first)) for first in range(0, n, size)]  # built before the clock
    await system.reset()
    w = await system.writer()
    try:
        srv0, me0 = ctx.procs.cpu_seconds(), time.process_time()
        t0 = time.monotonic()
        for b in batches:
            await w.write(b)
        elapsed = time.monotonic() - t0
        srv, me = ctx.procs.cpu_seconds() - srv0, time.process_time() - me0
    finally:
        await w.close()
    metrics: dict[str, float] = {"n": n, "seconds": elapsed}
    cpu = _cpu(metrics, elapsed, srv, writer=me)
    return [Row("ingest", system.name, rate(n, elapsed), "mut/s", metrics=metrics,
                detail=f"{system.method['ingest']}; {n:,} docs; {cpu}")]


async def backfill(system: System, ctx: Ctx) -> list[Row]:
    n, size = ctx.sizes.backfill_n, ctx.sizes.batch
    await system.reset()
    w = await system.writer()
    try:
        t0 = time.monotonic()
        for first in range(0, n, size):
            await w.write(batch(first, min(size, n - first)))
        preload_s = time.monotonic() - t0
    finally:
        await w.close()
    srv0 = ctx.procs.cpu_seconds()
    cp = ConsumerProcess(ctx.procs, system.stream_module, system.consumer_conn(), "backfill",
                         ctx.workdir / f"{system.name}-backfill.log", n=n, timeout_s=ctx.sizes.workload_timeout_s)
    res = await cp.result(ctx.sizes.workload_timeout_s + 30)
    srv = ctx.procs.cpu_seconds() - srv0
    if res["received"] < n:
        raise ConsumerError(f"backfill received {res['received']:,} of {n:,} in {res['seconds']:.1f}s")
    metrics = {"n": n, "seconds": res["seconds"], "subscribe_seconds": res["subscribe_seconds"],
               "preload_seconds": preload_s}
    cpu = _cpu(metrics, res["seconds"], srv, consumer=res["cpu_s"])
    return [Row("backfill", system.name, rate(n, res["seconds"]), "mut/s", metrics=metrics,
                detail=f"{system.method['backfill']}; {n:,} docs, one consumer process; {cpu}")]


@dataclass
class Paced:
    written: int
    t_start_ns: int
    t_end_ns: int
    sent: array  # type: ignore[type-arg]
    acked: array  # type: ignore[type-arg]

    @property
    def achieved(self) -> float:
        return self.written / max(1e-9, (self.t_end_ns - self.t_start_ns) / 1e9)


async def paced_write(w: Writer, per_s: int, seconds: float, max_batch: int = 1000) -> Paced:
    """Write ``per_s`` documents a second for ``seconds``: each pass sends what is due by now.

    A slow ack makes the next batch larger (the schedule is kept), so the achieved rate only falls
    short of the target when the system cannot keep up; it is reported beside the figures.
    """
    total = int(per_s * seconds)
    sent = array("q", [-1]) * total
    acked = array("q", [-1]) * total
    t_start = time.monotonic_ns()
    hard_stop = t_start + int((seconds * 3 + 10) * 1e9)
    nxt = 0
    while nxt < total:
        now = time.monotonic_ns()
        if now > hard_stop:
            break
        due = min(total, int((now - t_start) * per_s / 1e9) + 1, nxt + max_batch)
        if due <= nxt:
            await asyncio.sleep(max(0.0, (t_start + nxt * 1e9 / per_s - now) / 1e9))
            continue
        docs = [(key_of(i), make_doc(i, now)) for i in range(nxt, due)]
        each = await w.write(docs)
        ack = time.monotonic_ns()
        for n, i in enumerate(range(nxt, due)):
            sent[i] = now
            acked[i] = each[n] if each else ack
        nxt = due
    return Paced(nxt, t_start, time.monotonic_ns(), sent, acked)


async def tail(system: System, ctx: Ctx, per_s: int) -> list[Row]:
    s = ctx.sizes
    capacity = int(per_s * s.tail_seconds)
    out = ctx.workdir / f"{system.name}-tail-{per_s}.recv"
    await system.reset(empty=False)
    cp = ConsumerProcess(ctx.procs, system.stream_module, system.consumer_conn(), "tail",
                         ctx.workdir / f"{system.name}-tail-{per_s}.log", capacity=capacity, out=str(out),
                         grace_s=s.drain_grace_s, timeout_s=s.workload_timeout_s)
    await cp.ready(60)
    w = await system.writer()
    srv0, me0, t0 = ctx.procs.cpu_seconds(), time.process_time(), time.monotonic()
    try:
        p = await paced_write(w, per_s, s.tail_seconds)
    finally:
        await w.close()
    cp.end(p.written, p.t_start_ns, p.t_end_ns)
    res = await cp.result(s.drain_grace_s + 60)
    wall, srv, me = time.monotonic() - t0, ctx.procs.cpu_seconds() - srv0, time.process_time() - me0
    recv = array("q")
    recv.frombytes(out.read_bytes())
    await _dump_tail(system, f"{system.name}-tail-{per_s}", p, recv)
    ack_lat, send_lat, early = [], [], 0
    for i in range(p.written):
        r = recv[i]
        if r < 0:
            continue
        d = r - p.acked[i]
        if d < 0:
            early += 1
            d = 0
        ack_lat.append(d / 1e6)
        send_lat.append((r - p.sent[i]) / 1e6)
    received = len(ack_lat)
    if received == 0:
        raise ConsumerError(f"tail consumer received none of {p.written:,} documents")
    lat = percentiles(ack_lat, LATENCY_PS)
    snd = percentiles(send_lat, LATENCY_PS)
    metrics = {**{f"ack_{k}_ms": v for k, v in lat.items()}, **{f"send_{k}_ms": v for k, v in snd.items()},
               "written": p.written, "received": received, "achieved_per_s": p.achieved,
               "received_before_ack_pct": 100 * early / received, "duplicates": res.get("dups", 0)}
    detail = (f"ack→receipt p50 {lat['p50']:.3f} p90 {lat['p90']:.3f} p99 {lat['p99']:.3f} "
              f"p99.9 {lat['p99.9']:.3f} ms; send→receipt p99 {snd['p99']:.3f} ms; "
              f"achieved {p.achieved:,.0f}/s; received {received:,}/{p.written:,}")
    if early:
        detail += f"; {100 * early / received:.0f}% received before the ack (counted as 0)"
    detail += "; " + _cpu(metrics, wall, srv, writer=me, consumer=res["cpu_s"])
    return [Row(f"tail {per_s:,}/s", system.name, lat["p99"], "ms p99", better="lower", metrics=metrics,
                detail=detail)]


async def _dump_tail(system: System, name: str, p: Paced, recv: array) -> None:  # type: ignore[type-arg]
    """Keep each write's send, ack and receipt times (and the server's metrics, if it has them)
    in ``$UPR_BENCH_TAIL_DUMP``, so a run's slow writes can be matched with what the processes
    did then (``bench.tail_decompose``)."""
    where = os.environ.get("UPR_BENCH_TAIL_DUMP")
    if not where:
        return
    base = Path(where) / name
    base.with_suffix(".sent").write_bytes(p.sent.tobytes())
    base.with_suffix(".acked").write_bytes(p.acked.tobytes())
    base.with_suffix(".recv").write_bytes(recv.tobytes())
    metrics_text = getattr(system, "metrics_text", None)
    if metrics_text is not None:
        base.with_suffix(".metrics").write_text(await metrics_text())


async def fanout(system: System, ctx: Ctx) -> list[Row]:
    s = ctx.sizes
    k, nproc = s.fanout_consumers, max(1, min(s.fanout_processes, s.fanout_consumers))
    await system.reset(empty=False)
    cps = []
    first = 1
    for j in range(nproc):
        count = k // nproc + (1 if j < k % nproc else 0)
        cps.append(ConsumerProcess(ctx.procs, system.stream_module, system.consumer_conn(), "fanout",
                                   ctx.workdir / f"{system.name}-fanout-{j}.log", consumers=count, first_ident=first,
                                   planned=int(s.fanout_rate * s.fanout_seconds), grace_s=s.drain_grace_s,
                                   timeout_s=s.workload_timeout_s))
        first += count
    for cp in cps:
        await cp.ready(120)
    w = await system.writer()
    srv0, me0, t0 = ctx.procs.cpu_seconds(), time.process_time(), time.monotonic()
    try:
        p = await paced_write(w, s.fanout_rate, s.fanout_seconds)
    finally:
        await w.close()
    for cp in cps:
        cp.end(p.written, p.t_start_ns, p.t_end_ns)
    consumers, consumer_cpu = [], 0.0
    for cp in cps:
        res = await cp.result(s.drain_grace_s + 60)
        consumers += res["consumers"]
        consumer_cpu += res["cpu_s"]
    wall, srv, me = time.monotonic() - t0, ctx.procs.cpu_seconds() - srv0, time.process_time() - me0
    delivered = sum(c["received"] for c in consumers)
    last = max(c["last_recv_ns"] for c in consumers)
    if delivered == 0 or last <= p.t_start_ns:
        raise ConsumerError("fan-out consumers received nothing")
    window = (last - p.t_start_ns) / 1e9
    behind = [c for c in consumers if c["received"] < p.written]
    worst_p99 = max(c["lag_ms"].get("p99", float("inf")) for c in consumers)
    worst_max = max(c["lag_ms"].get("p100", float("inf")) for c in consumers)
    # the worst median tells a steady lag from a start-up transient that only the tail percentiles see
    worst_p50 = max(c["lag_ms"].get("p50", float("inf")) for c in consumers)
    metrics = {"consumers": k, "written": p.written, "delivered": delivered, "expected": p.written * k,
               "window_s": window, "achieved_write_per_s": p.achieved, "worst_lag_p99_ms": worst_p99,
               "worst_lag_max_ms": worst_max, "worst_lag_p50_ms": worst_p50, "consumers_short": len(behind)}
    # CPU per delivered item: what the figures cost each side, whatever share of the cores the
    # machine gave it (wall-clock lags on a loaded machine are its queueing; these are not)
    metrics["server_cpu_us_per_delivery"] = 1e6 * srv / delivered
    metrics["consumer_cpu_us_per_delivery"] = 1e6 * consumer_cpu / delivered
    metrics["consumer_processes"] = nproc
    metrics["reads_per_delivery"] = sum(c.get("reads", 0) for c in consumers) / delivered
    tag = f"fan-out {k}×{s.fanout_rate:,}/s"
    short = f"; {len(behind)} consumers short of {p.written:,}" if behind else ""
    return [
        Row(tag, system.name, rate(delivered, window), "deliveries/s", metrics=metrics,
            detail=f"{system.method['fanout']}; delivered {delivered:,}/{p.written * k:,} in {window:.1f}s{short}; "
                   + _cpu(metrics, wall, srv, writer=me, consumer=consumer_cpu)
                   + f"; CPU µs per delivery: server {metrics['server_cpu_us_per_delivery']:.1f}, "
                     f"consumers {metrics['consumer_cpu_us_per_delivery']:.1f} ({nproc} processes); "
                     f"{metrics['reads_per_delivery']:.2f} reads per delivery"),
        Row(tag + " lag", system.name, worst_p99, "ms p99 worst", better="lower", metrics=metrics,
            detail=f"send→receipt lag of the worst consumer: p99 {worst_p99:.2f} ms, max {worst_max:.2f} ms; "
                   f"worst median {worst_p50:.2f} ms"),
    ]
