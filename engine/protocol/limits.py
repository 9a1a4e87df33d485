"""How big protocol values and connections may get: fixed wire limits and tunable ones.

The fixed limits are part of the protocol (they appear as ``maxLength``/``maxItems`` in
``openapi/asyncapi.yaml``), so every peer refuses the same inputs; names follow DCP where DCP has
one (a connection name of at most 200 characters).  ``ProtocolLimits`` holds what an operator may
tune per connection, because the right bound depends on the partition count and the consumers.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "MAX_COOKIE_CHARS",
    "MAX_FAILOVER_ENTRIES",
    "MAX_NAME_CHARS",
    "MAX_PARTITIONS_LIST",
    "MAX_PARTITION_ID",
    "MAX_TEXT_CHARS",
    "MAX_WINDOW_BYTES",
    "ProtocolLimits",
]

MAX_NAME_CHARS = 200  # DCP's connection-name limit
MAX_COOKIE_CHARS = 64
MAX_PARTITION_ID = 0xFFFF  # partitions travel as u16 in binary frames
MAX_PARTITIONS_LIST = MAX_PARTITION_ID + 1
MAX_FAILOVER_ENTRIES = 1000
MAX_TEXT_CHARS = 4096  # error/detail strings
MAX_WINDOW_BYTES = 1 << 40


@dataclass(frozen=True, slots=True)
class ProtocolLimits:
    """Per-connection limits the server enforces (configurable; defaults suit 64 partitions)."""

    #: Largest client text frame accepted (a hello naming 65,536 partitions fits).
    max_message_bytes: int = 1 << 20
    #: Cookies waiting for their barrier on one connection.
    max_pending_cookies: int = 1024
    #: Flow-control window used when hello sends ``window_bytes: null``.
    default_window_bytes: int = 16 << 20
    min_window_bytes: int = 4096
    max_window_bytes: int = 1 << 30
