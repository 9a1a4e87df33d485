"""A free TCP port, for servers a test must start (or restart) on an address it chose itself."""
from __future__ import annotations

from bench.suite.ports import free_port

__all__ = ["free_port"]
