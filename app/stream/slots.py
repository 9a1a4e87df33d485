"""Stream connection slots: how many WebSockets the server, and each client, may hold open.

WHY per client as well as per server: a slot is taken at the upgrade, before the client says
anything, so one client opening connections it never uses (or never sends ``hello`` on) could
otherwise lock every other consumer out.  A client is its bearer token's name when auth is on
(one tenant, however many addresses it connects from) and its address in protected mode (every
local caller shares the one admin identity there).  Everything runs on the event loop: no locks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["ConnectionSlots", "SlotRefusal"]


@dataclass(frozen=True, slots=True)
class SlotRefusal:
    """Why a connection gets no slot: the server's limit or this client's."""

    scope: Literal["server", "client"]
    limit: int


class ConnectionSlots:
    """Counts open connections in total and per client against two limits."""

    def __init__(self, max_total: int, max_per_client: int) -> None:
        if max_total < 1 or max_per_client < 1:
            raise ValueError("connection limits must be at least 1")
        self.max_total = max_total
        self.max_per_client = max_per_client
        self.total = 0
        self._held: dict[str, int] = {}

    def acquire(self, client: str) -> SlotRefusal | None:
        """Take a slot for ``client``, or say which limit refuses it (nothing is taken then)."""
        if self.total >= self.max_total:
            return SlotRefusal("server", self.max_total)
        held = self._held.get(client, 0)
        if held >= self.max_per_client:
            return SlotRefusal("client", self.max_per_client)
        self._held[client] = held + 1
        self.total += 1
        return None

    def release(self, client: str) -> None:
        """Give back a slot ``acquire`` granted (once per grant)."""
        held = self._held.get(client, 0)
        if held <= 0:
            raise RuntimeError(f"release without a slot held by {client!r}")
        if held == 1:
            del self._held[client]
        else:
            self._held[client] = held - 1
        self.total -= 1

    def held(self, client: str) -> int:
        return self._held.get(client, 0)
