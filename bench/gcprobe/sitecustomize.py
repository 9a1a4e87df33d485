"""Log every cyclic-GC collection of every Python process started with this on its path.

    UPR_GCPROBE_DIR=/tmp/gc PYTHONPATH=$PWD/bench/gcprobe:$PWD .venv/bin/python -m bench ...

Each process appends one line per collection to ``$UPR_GCPROBE_DIR/<pid>.gc``: the generation,
the start (``time.monotonic_ns``, the clock the peer suite stamps writes and receipts with, so a
collection can be matched with the writes it overlapped), the wall and CPU nanoseconds it held
the GIL, the objects collected and the objects tracked in that generation when it started.  The
first line names the process (its argv).  Without ``UPR_GCPROBE_DIR`` nothing is installed.
"""
from __future__ import annotations

import gc
import os
import sys
import time

_DIR = os.environ.get("UPR_GCPROBE_DIR")


def _install(directory: str) -> None:
    fd = os.open(os.path.join(directory, f"{os.getpid()}.gc"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, ("# " + " ".join(sys.orig_argv) + "\n").encode())
    state = [0, 0, 0]
    mono, cpu = time.monotonic_ns, time.thread_time_ns

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            state[2] = gc.get_count()[0]
            state[0], state[1] = mono(), cpu()
            return
        wall, used = mono() - state[0], cpu() - state[1]
        os.write(fd, f"{info['generation']} {state[0]} {wall} {used} {info['collected']} {state[2]}\n".encode())

    gc.callbacks.append(on_gc)


if _DIR:
    _install(_DIR)
