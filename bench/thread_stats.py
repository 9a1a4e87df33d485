"""Each thread of a process, from ``/proc`` (Linux): its CPU seconds and context switches, and
the Python name of each OS thread.

WHY: on a shared two-core machine a thread's CPU per request and its switches per request hardly
move with the load, so the per-thread benches (``bench.thread_cpu``, ``bench.cluster_cpu``)
compare those, not wall-clock latencies.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

__all__ = ["ThreadStat", "python_thread_names", "thread_stats"]

TICK = os.sysconf("SC_CLK_TCK")


class ThreadStat(NamedTuple):
    name: str  # the kernel's name (``comm``), e.g. ``upr`` or ``libuv-worker``
    cpu_s: float  # user + system
    voluntary: int  # context switches so far
    involuntary: int
    system_s: float


def thread_stats(pid: int) -> dict[int, ThreadStat]:
    """OS thread id -> its counters so far (``/proc/PID/task/*/stat`` and ``status``)."""
    out: dict[int, ThreadStat] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                stat = f.read()
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                status = f.read()
        except OSError:
            continue  # the thread ended between the listing and the read
        fields = stat[stat.rindex(")") + 2:].split()
        out[int(tid)] = ThreadStat(
            name=stat[stat.index("(") + 1:stat.rindex(")")],
            cpu_s=(int(fields[11]) + int(fields[12])) / TICK,
            voluntary=int(status.split("voluntary_ctxt_switches:")[1].split()[0]),
            involuntary=int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0]),
            system_s=int(fields[12]) / TICK)
    return out


def python_thread_names(pid: int) -> dict[int, str]:
    """OS thread id -> Python thread name, from ``py-spy dump`` (threads Python does not know,
    and a failed dump, keep their kernel name).  Numbered pool workers lose their number, so a
    pool's threads add up under one name."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    try:
        dump = subprocess.run([spy, "dump", "--json", "--nonblocking", "--pid", str(pid)],
                              capture_output=True, timeout=30, check=True).stdout
        threads = json.loads(dump)
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    return {t["os_thread_id"]: re.sub(r"_\d+$", "", t["thread_name"] or "?")
            for t in threads if t.get("os_thread_id")}
