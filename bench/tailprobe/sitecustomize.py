"""Stamp each stage of a bulk write's way to the stream socket in a upr server process.

    UPR_TAILPROBE_DIR=/tmp/probe UPR_BENCH_TAIL_DUMP=/tmp/tail PYTHONPATH=$PWD/bench/tailprobe:$PWD \\
        .venv/bin/python -m bench --full --no-install --systems upr --workloads tail --set tail_rates=2500
    PYTHONPATH=$PWD .venv/bin/python -m bench.tail_stages_match /tmp/tail /tmp/probe

Only in a process whose argv is ``app.cli server``; without ``UPR_TAILPROBE_DIR`` nothing is
installed.  Each event is one line ``<tag> <time.monotonic_ns> <thread CPU ns>`` in
``$UPR_TAILPROBE_DIR/<pid>.stages``: ``R`` the bulk route starts (loop), ``J``/``j`` the writer
thread's job starts/ends (parse + apply), ``D``/``d`` the hub's delivery starts/ends (loop),
``W`` a stream message handed to the transport, ``A`` the bulk route answers, ``F``/``f`` a flush
round starts/ends (flusher thread; the round's commit and fsync included).  The modules are
patched as they are imported (a meta-path finder), so the server runs its own code otherwise.
"""
from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
import threading
import time

_DIR = os.environ.get("UPR_TAILPROBE_DIR")


def _install(directory: str) -> None:
    out = open(os.path.join(directory, f"{os.getpid()}.stages"), "a", buffering=1)  # line-buffered: the server may be killed
    lock = threading.Lock()
    mono, cpu = time.monotonic_ns, time.thread_time_ns

    def stamp(tag: str) -> None:
        line = f"{tag} {mono()} {cpu()}\n"
        with lock:
            out.write(line)

    def patch_bulk(mod: object) -> None:
        answer, run = mod.answer, mod._run  # type: ignore[attr-defined]

        @functools.wraps(answer)
        async def timed_answer(*a: object, **k: object) -> object:
            stamp("R")
            try:
                return await answer(*a, **k)
            finally:
                stamp("A")

        @functools.wraps(run)
        def timed_run(*a: object, **k: object) -> object:
            stamp("J")
            try:
                return run(*a, **k)
            finally:
                stamp("j")

        mod.answer, mod._run = timed_answer, timed_run  # type: ignore[attr-defined]

    def patch_hub(mod: object) -> None:
        cls = mod.ChangeHub  # type: ignore[attr-defined]
        deliver = cls._deliver

        def timed_deliver(self: object, dirty: frozenset[int]) -> None:
            stamp("D")
            try:
                deliver(self, dirty)
            finally:
                stamp("d")

        cls._deliver = timed_deliver

    def patch_raw(mod: object) -> None:
        cls = mod.RawFrames  # type: ignore[attr-defined]
        write, write_parts = cls.write, cls.write_parts

        def timed_write(self: object, data: object) -> None:
            write(self, data)
            stamp("W")

        def timed_write_parts(self: object, parts: object, length: int) -> None:
            write_parts(self, parts, length)
            stamp("W")

        cls.write, cls.write_parts = timed_write, timed_write_parts

    def patch_flusher(mod: object) -> None:
        cls = mod.Flusher  # type: ignore[attr-defined]
        flush_round = cls.flush_round

        def timed_round(self: object) -> object:
            stamp("F")
            try:
                return flush_round(self)
            finally:
                stamp("f")

        cls.flush_round = timed_round

    patches = {"engine.flusher": patch_flusher, "app.routes.bulk": patch_bulk, "app.stream.hub": patch_hub, "app.stream.rawframes": patch_raw}

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name: str, path: object, target: object = None) -> object:
            if name not in patches:
                return None
            spec = importlib.machinery.PathFinder.find_spec(name, path)  # type: ignore[arg-type]
            if spec is None or spec.loader is None:
                return spec
            loader, fix = spec.loader, patches[name]
            exec_module = loader.exec_module

            def exec_and_patch(module: object) -> None:
                exec_module(module)  # type: ignore[arg-type]
                fix(module)

            loader.exec_module = exec_and_patch  # type: ignore[method-assign]
            return spec

    sys.meta_path.insert(0, Finder())


if _DIR and "app.cli" in sys.orig_argv and "server" in sys.orig_argv:
    _install(_DIR)
