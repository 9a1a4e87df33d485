"""A free TCP port, for servers a test must restart on the same address."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A port nothing listens on right now (the kernel picks it; a race with other processes is
    possible but harmless on 127.0.0.1 in a test run)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
