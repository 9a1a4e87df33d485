"""Tokens the HTTP tests' servers are configured with, one per role."""
from __future__ import annotations

TOKENS = {"reader-token-0001": "read", "writer-token-0001": "write", "admin-token-00001": "admin"}
