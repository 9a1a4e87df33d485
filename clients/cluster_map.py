"""Reading a cluster's partition map: ``GET /cluster`` from every node named, the newest answer winning.

Apart from the streams that follow it because a map read is its own concern with its own failure
rules (a hung node, a node behind etcd, a node that is not in a cluster at all), and because the
consumer reads it before it knows whether it talks to a cluster.
"""
from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from typing import Any

import httpx

from engine.protocol.client.routing import MapFormatError, MapView

from .errors import AuthFailed, ConnectionFailed
from .redirects import parse_servers

__all__ = ["MAP_GRACE_S", "read_cluster_map", "split_servers"]


def split_servers(server: str | Sequence[str]) -> list[str]:
    """A cluster address: one URL, "URL,URL", or a list of URLs (any node will do); the same
    rules as the document commands' ``--server`` (``clients.redirects.parse_servers``)."""
    return list(parse_servers(server if isinstance(server, str) else ",".join(server)))


#: after the first node answered the map, how long the others may still answer with a newer one
MAP_GRACE_S = 0.05


async def read_cluster_map(client: httpx.AsyncClient, urls: Iterable[str], token: str | None,
                           timeout: float) -> tuple[MapView | None, str]:
    """``GET /cluster`` from every URL at once: (the newest map answered, the URL that answered
    it), or (None, URL) when no node answered a map and that one is not in a cluster (404).

    At once, because a hung node (paused, overloaded) accepts connections and answers nothing:
    asking one node after the other would wait out its timeout before asking the next.  The
    first map is kept once the others had ``MAP_GRACE_S`` more to answer, the newest revision
    winning (a node that has not caught up with etcd answers an older one).
    ``ConnectionFailed`` naming every URL when none answered; ``AuthFailed`` for a refused token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}

    async def one(url: str) -> tuple[str, Any]:
        try:
            resp = await client.get(f"{url}/cluster", headers=headers, timeout=timeout)
        except httpx.HTTPError as exc:
            return "error", f"{url}: {exc or type(exc).__name__}"
        if resp.status_code == 404:
            return "single", url
        if resp.status_code in (401, 403):
            raise AuthFailed(f"{url}/cluster: HTTP {resp.status_code}: the token is missing, unknown or lacks "
                             f"the read role", field="token")
        if resp.status_code != 200:
            return "error", f"{url}: HTTP {resp.status_code}"
        try:
            return "map", (MapView.from_cluster_json(resp.json()), url)
        except (MapFormatError, ValueError) as exc:
            return "error", f"{url}: {exc}"

    pending = {asyncio.ensure_future(one(url)) for url in dict.fromkeys(urls)}
    loop = asyncio.get_running_loop()
    maps: list[tuple[MapView, str]] = []
    singles: list[str] = []
    why: list[str] = []
    grace_until: float | None = None
    try:
        while pending:
            wait = None if grace_until is None else max(0.0, grace_until - loop.time())
            done, pending = await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                break  # the grace is over: the maps at hand will do
            for task in done:
                kind, value = task.result()
                if kind == "map":
                    maps.append(value)
                    if grace_until is None:
                        grace_until = loop.time() + MAP_GRACE_S
                elif kind == "single":
                    singles.append(value)
                else:
                    why.append(value)
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
    if maps:
        return max(maps, key=lambda found: found[0].revision)
    if singles:
        return None, singles[0]
    raise ConnectionFailed("no node answered GET /cluster: " + "; ".join(sorted(why) or ["no URL"]))
