"""Stamps of replicated batches on a replica node, for the lag benchmark's per-stage figures.

Off unless the node's environment names a file (``UPR_REPLICATION_TRACE``); then, for every
item batch a replication connection receives, one JSON line ``[partition, last seqno, arrived,
taken, applied]``: when its WebSocket message was read off the socket, when the applier took it
from the inbox, and when the engine held it (``time.monotonic()``, the host's clock, so the
benchmark can set the stamps beside its own acks and observations).  WHY a file and not a
metric: the benchmark needs each write's stages to find where the lag queues (bench/cluster_lag.py
``--lag-stages``), and a histogram on the node could not be joined with the writer's acks.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import IO, Any

from engine.protocol.frames import ItemBatch
from engine.protocol.packed import PackedPass

TRACE_ENV = "UPR_REPLICATION_TRACE"


class ReplicationTrace:
    """Appends stamps to one file; ``None`` from ``from_env`` when tracing is off (the default)."""

    def __init__(self, path: str) -> None:
        self._out: IO[bytes] = open(path, "ab", buffering=1 << 16)  # noqa: SIM115 - open for the node's life

    @classmethod
    def from_env(cls) -> ReplicationTrace | None:
        path = os.environ.get(TRACE_ENV)
        return cls(path) if path else None

    def record(self, received: Sequence[tuple[Any, int]], arrived: Sequence[float], taken: float,
               applied: float) -> None:
        lines = []
        for (msg, _nbytes), at in zip(received, arrived):
            batches = [s.batch for s in msg.sections] if type(msg) is PackedPass else [msg]
            for batch in batches:
                if type(batch) is ItemBatch and len(batch):
                    lines.append(f"[{batch.partition},{batch.seqnos[-1]},{at:.6f},{taken:.6f},{applied:.6f}]\n")
        if lines:
            self._out.write("".join(lines).encode())
            self._out.flush()
