"""A free TCP port on 127.0.0.1, for servers a test or a benchmark starts (or restarts) on an address
it chose itself."""
from __future__ import annotations

import os
import random
import socket

#: below the kernel's ephemeral range when it can be read (Linux's default starts at 32768)
_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST = 10000

_rng = random.Random(os.getpid())
_handed_out: set[int] = set()


def _ephemeral_start() -> int:
    try:
        with open(_RANGE_FILE) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port nothing listens on right now, chosen *below* the ephemeral range.

    WHY not the kernel's pick (bind to port 0): that port comes from the ephemeral range, which
    every outgoing connection of the test run (HTTP clients, etcd clients, replication streams)
    also draws its local port from, so between this call and the server's bind another process
    could connect out from it and the server would fail with "address already in use".  Below the
    range only another caller of this function can take it; each process draws at random and never
    hands the same port out twice."""
    top = _ephemeral_start()
    if top - _LOWEST < 1000:   # an unusual range: fall back to the kernel's choice
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    for _ in range(200):
        port = _rng.randrange(_LOWEST, top)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free port found in {_LOWEST}..{top}")
