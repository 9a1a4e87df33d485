"""A cluster address as users write it: one or more node URLs, any of which will do.

One rule for every client that takes ``--server URL[,URL...]`` or a ``server`` option (the
document commands, consumers, backup, the Spark source), pure so the Spark source's driver
process can use it without loading the client library.
"""
from __future__ import annotations

from urllib.parse import urlparse

from engine.protocol.client.errors import UsageError


def parse_servers(text: str) -> tuple[str, ...]:
    """``"http://a:1, http://b:2/"`` -> ``("http://a:1", "http://b:2")``; a ``UsageError`` on
    ``server`` when empty or when an entry is not an http(s) URL with a host."""
    servers = tuple(s.strip().rstrip("/") for s in text.split(",") if s.strip())
    if not servers:
        raise UsageError(f"no server URL in {text!r}", field="server")
    for server in servers:
        url = urlparse(server)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise UsageError(f"server {server!r} is not an http:// or https:// URL", field="server")
    return servers
