"""CPU seconds of this process and its descendants, by role, from ``/proc`` (Linux).

On a shared machine wall-clock rates move with the other tenants' load; the CPU that each part
of a pipeline spends on the same rows does not (much).  ``snapshot()`` reads utime+stime of every
descendant of this process, ``spent(before, after)`` sums the differences by role (the Spark
driver JVM, the executor JVM, the Python workers, the upr server, this process...), so a bench can
say where the CPU of a read went.  A process that ended between two snapshots is missed (its
parent counts it only once it is reaped): compare phases in which the same processes live.
"""
from __future__ import annotations

import os
from collections import defaultdict

TICK = os.sysconf("SC_CLK_TCK")

#: cmdline fragment -> role, first match wins
ROLES = (
    ("CoarseGrainedExecutorBackend", "executor JVM"),
    ("org.apache.spark.deploy.master.Master", "spark master"),
    ("org.apache.spark.deploy.worker.Worker", "spark worker daemon"),
    ("SparkSubmit", "driver JVM"),
    ("pyspark.daemon", "python workers"),
    ("pyspark.worker", "python workers"),
    ("python_streaming_source_runner", "python workers"),
    ("app.cli", "upr server"),
    ("uvicorn", "upr server"),
    ("bench.rebalance_probes", "probe process"),
)


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = defaultdict(list)
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(b")") + 2:].split()[1])
        kids[ppid].append(int(name))
    return kids


def _cpu(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK          # utime, stime


def _role(pid: int) -> str:
    if pid == os.getpid():
        return "bench process"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "other"
    for fragment, role in ROLES:
        if fragment in cmd:
            return role
    return "other"


def snapshot() -> dict[int, tuple[str, float]]:
    """pid -> (role, CPU seconds so far) for this process and all its descendants."""
    kids = _children()
    out: dict[int, tuple[str, float]] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        cpu = _cpu(pid)
        if cpu is not None:
            out[pid] = (_role(pid), cpu)
        todo.extend(kids.get(pid, ()))
    return out


def spent(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds by role between two snapshots (processes born in between count from 0)."""
    by_role: dict[str, float] = defaultdict(float)
    for pid, (role, cpu) in after.items():
        by_role[role] += cpu - (before[pid][1] if pid in before else 0.0)
    return {role: s for role, s in sorted(by_role.items(), key=lambda kv: -kv[1]) if s > 0.005}


def describe(by_role: dict[str, float], rows: int) -> str:
    """``total X µs/row: role Y, ...`` for a phase that moved ``rows`` rows."""
    total = sum(by_role.values())
    parts = ", ".join(f"{role} {s / rows * 1e6:.1f}" for role, s in by_role.items())
    return f"CPU {total / rows * 1e6:.1f} us/row ({parts})"
