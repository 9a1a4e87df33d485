"""What each replica copy says it holds: the active's view of its replicas, per partition.

A replication stream reports, per partition, the highest seqno the replica holds in memory
(``received``) and the highest it has persisted (``persisted``), like DCP's
``DCP_SEQNO_ACKNOWLEDGED``.  The active needs both: durable writes wait on them
(``engine.cluster.durability``) and ``GET /cluster`` shows each replica's lag from them.

Within one stream the figures only grow: an ack that arrives late (behind a newer one) is kept
out, because counting a copy as holding less than it does would only delay writers, while
counting it as holding more would acknowledge writes it does not hold.  A new stream starts
from nothing (``stream_started``): the replica may have rolled back, and its old figures would
claim writes it has since thrown away.

Pure: the server adapter feeds it validated ``seqno_ack`` messages.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["AckError", "ReplicaAck", "ReplicaAcks"]


class AckError(ValueError):
    """An acknowledgement that cannot be true (negative, or persisted beyond received)."""

    def __init__(self, node: str, partition: int, received: int, persisted: int) -> None:
        super().__init__(
            f"replica {node!r} partition {partition}: impossible ack received={received} persisted={persisted}"
        )
        self.node = node
        self.partition = partition


@dataclass(frozen=True, slots=True)
class ReplicaAck:
    """The highest seqno a replica holds in memory and the highest it has persisted."""

    received: int = 0
    persisted: int = 0

    def to_json(self, high_seqno: int) -> dict[str, int]:
        """Both figures and how far the received one trails the active's ``high_seqno``."""
        return {
            "received_seqno": self.received,
            "persisted_seqno": self.persisted,
            "lag": max(0, high_seqno - self.received),
            "persist_lag": max(0, high_seqno - self.persisted),
        }


class ReplicaAcks:
    """The latest acknowledgement of every (replica node, partition) pair."""

    def __init__(self) -> None:
        self._acks: dict[tuple[str, int], ReplicaAck] = {}

    def stream_started(self, node: str, partition: int) -> None:
        """A new stream from ``node`` for ``partition``: nothing is known about it until it acks."""
        self._acks[(node, partition)] = ReplicaAck()

    def acknowledged(self, node: str, partition: int, received: int, persisted: int) -> ReplicaAck:
        """Record an ack; raises ``AckError`` for figures no replica can report."""
        if received < 0 or persisted < 0 or persisted > received:
            raise AckError(node, partition, received, persisted)
        before = self._acks.get((node, partition), ReplicaAck())
        ack = ReplicaAck(max(before.received, received), max(before.persisted, persisted))
        self._acks[(node, partition)] = ack
        return ack

    def forget(self, node: str) -> None:
        """``node`` left (or its connection closed): it holds nothing the active can count on."""
        for key in [key for key in self._acks if key[0] == node]:
            del self._acks[key]

    def forget_stream(self, node: str, partition: int) -> None:
        """The stream of ``partition`` from ``node`` ended: its figures no longer vouch for anything
        (the next stream may follow a rollback), so the copy counts as unknown until it acks again."""
        self._acks.pop((node, partition), None)

    def get(self, node: str, partition: int) -> ReplicaAck | None:
        """The latest ack of ``node`` for ``partition``, None if it never streamed it."""
        return self._acks.get((node, partition))

    def replicas_of(self, partition: int) -> dict[str, ReplicaAck]:
        """Every replica node that streams ``partition``, with its latest ack."""
        return {node: ack for (node, p), ack in self._acks.items() if p == partition}
