"""Carrying out a ``RollbackPlan``: the corrections (each key's current document, read over HTTP) or
the partition reset, as the events the application receives.

Why corrections and not undo: a downstream index cannot undo mutations by itself, so the keys the
ring says were applied above the rollback seqno are re-read and handed over as their current
versions (or deletions).  They are idempotent, so a crash before the plan is finished simply
repeats them.  The session decides the plan; this module only fetches and renders it.
"""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from engine.core.types import Document
from engine.protocol.client.actions import RollbackPlan

from .connection import ReconnectNeeded
from .errors import ConnectionFailed
from .events import Deletion, Event, Mutation, PartitionReset, Rollback
from .http import AsyncHttpApi

__all__ = ["repair_events"]


async def repair_events(plan: RollbackPlan, http: AsyncHttpApi, concurrency: int,
                        corrected: list[tuple[bytes, int]]) -> AsyncIterator[Event]:
    """The events of ``plan``; fills ``corrected`` with (key, seqno) of corrections whose current
    version is above the rollback seqno (they stay in the ring: that version may be rolled back)."""
    p = plan.partition
    if plan.reset:
        yield PartitionReset(p, plan.seqno, plan.reason)
        return
    docs = await _fetch(http, [k.decode() for k in plan.keys], concurrency)
    high = 0
    if any(doc is None for doc in docs):
        # A 404 does not say at which seqno the key was deleted; the partition's high seqno
        # (read after the GETs) bounds it, so the key stays covered until the stream passes it.
        high = await _high_seqno(http, p)
    yield Rollback(p, plan.seqno, plan.reason, plan.detail, len(plan.keys), plan.resume)
    for key, doc in zip(plan.keys, docs):
        if doc is None:
            yield Deletion(p, plan.seqno, key.decode(), 0, 0, correction=True)
            if high > plan.seqno:
                corrected.append((key, high))
        else:
            yield Mutation(p, doc.seqno, doc.key, doc.value, doc.cas, doc.rev, correction=True)
            if doc.seqno > plan.seqno:
                corrected.append((key, doc.seqno))


async def _high_seqno(http: AsyncHttpApi, partition: int) -> int:
    try:
        return int((await http.partition(partition))["high_seqno"])
    except ConnectionFailed as exc:
        raise ReconnectNeeded(f"cannot read partition {partition}: {exc}") from None


async def _fetch(http: AsyncHttpApi, keys: list[str], concurrency: int) -> list[Document | None]:
    sem = asyncio.Semaphore(concurrency)

    async def one(key: str) -> Document | None:
        async with sem:
            return await http.get(key)

    try:
        return list(await asyncio.gather(*(one(k) for k in keys)))
    except ConnectionFailed as exc:
        raise ReconnectNeeded(f"cannot read corrections: {exc}") from None
