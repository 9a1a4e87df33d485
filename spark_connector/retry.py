"""Bounded retries with backoff for what a trigger needs from the server: metadata and stream connects.

A server restart or a failover takes seconds; a query that fails its trigger at the first refused
connection makes a routine restart an outage of every downstream job.  Kafka's source retries
offset fetches (``fetchOffset.numRetries``, ``fetchOffset.retryIntervalMs``); this source takes
the same two options and applies them to both calls, with the wait doubling from the interval
(capped at ``MAX_DELAY_S``).  Only faults that can heal are retried (the server cannot be reached,
answers 5xx, or a connection drops); a refusal (4xx, a bad token) fails at once.  When the retries
run out, ``SourceUnavailable`` says what failed, where, how often and for how long.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from engine.core.errors import UprError

T = TypeVar("T")

#: The longest single wait between two attempts.
MAX_DELAY_S = 30.0


class SourceUnavailable(UprError):
    """The server did not answer a trigger's request within the configured retries."""

    code = "source_unavailable"


class Retryable(Exception):
    """Raised by an attempt whose fault may heal (connection refused or lost, 5xx, timeout)."""


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """``retries`` further attempts after the first, waiting ``interval_s``, then twice that, ..."""

    retries: int = 3
    interval_s: float = 1.0

    def delays(self) -> Iterator[float]:
        delay = self.interval_s
        for _ in range(self.retries):
            yield min(delay, MAX_DELAY_S)
            delay *= 2

    def describe(self) -> str:
        return f"fetchOffset.numRetries={self.retries}, fetchOffset.retryIntervalMs={round(self.interval_s * 1000)}"


def call_with_retries(what: str, attempt: Callable[[], T], policy: RetryPolicy,
                      sleep: Callable[[float], None] = time.sleep) -> T:
    """``attempt()`` until it returns, retrying on ``Retryable`` as ``policy`` allows; then
    ``SourceUnavailable`` naming ``what`` (e.g. "GET /partitions from http://...") and the last cause."""
    started = time.monotonic()
    delays = policy.delays()
    attempts = 0
    while True:
        attempts += 1
        try:
            return attempt()
        except Retryable as exc:
            delay = next(delays, None)
            if delay is None:
                raise SourceUnavailable(
                    f"{what}: {exc}; gave up after {attempts} attempt{'s' if attempts > 1 else ''} in "
                    f"{time.monotonic() - started:.1f} s ({policy.describe()})") from None
            sleep(delay)
