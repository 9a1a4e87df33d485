"""Helpers for backup tests against real server processes."""
from __future__ import annotations

import base64
import os
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import httpx

from tests.support.docs import bulk as post_bulk

ROOT = Path(__file__).resolve().parents[2]


def bulk(url: str, ops: Sequence[dict[str, Any]], durability: str = "persist", chunk: int = 500) -> None:
    """Persist by default (a backup must find it); deleting an absent key is a fine 404 item."""
    post_bulk(url, ops, durability, chunk=chunk, ok_statuses=(200, 404))


def set_op(key: str, value: bytes) -> dict[str, Any]:
    return {"op": "set", "key": key, "value_b64": base64.b64encode(value).decode()}


def del_op(key: str) -> dict[str, Any]:
    return {"op": "delete", "key": key}


def read_state(url: str, keys: Iterable[str]) -> dict[str, bytes | None]:
    """Current value of every key (None = absent), read one by one through GET /docs/{key}."""
    out: dict[str, bytes | None] = {}
    with httpx.Client(base_url=url, timeout=30) as c:
        for k in sorted(set(keys)):
            r = c.get(f"/docs/{k}")
            if r.status_code == 404:
                out[k] = None
            else:
                r.raise_for_status()
                out[k] = r.content
    return out


def cli(*args: str, check: bool = False, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}
    r = subprocess.run([sys.executable, "-m", "clients.backup.cli", "backup", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise AssertionError(f"upr backup {args[0]} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
    return r


def cli_popen(*args: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("UPR_")}
    return subprocess.Popen([sys.executable, "-m", "clients.backup.cli", "backup", *args, "--quiet"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
