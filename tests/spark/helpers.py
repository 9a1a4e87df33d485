"""Shared helpers for the Spark end-to-end tests: writing documents and the brute-force index."""
from __future__ import annotations

import json
import random
from collections.abc import Iterable

from clients.http import HttpApi
from spark_connector.index.functions import FieldIndex
from tests.support.docs import bulk as post_bulk

CITIES = ["oslo", "lima", "rome", "kyiv", "pune", "nice", "bern"]


def bulk(url: str, ops: list[dict], durability: str = "memory") -> None:
    """Write in requests of 1,000 items; every item must succeed."""
    post_bulk(url, ops, durability, chunk=1000, ok_statuses=(200,))


def random_ops(rng: random.Random, keys: list[str], live: set[str], n: int, delete_ratio: float = 0.15) -> list[dict]:
    """Random sets (some without the field, some multi-valued) and deletes of live keys; ``live``
    is updated to what the server will hold."""
    ops = []
    for _ in range(n):
        key = rng.choice(keys)
        if key in live and rng.random() < delete_ratio:
            ops.append({"op": "delete", "key": key})
            live.discard(key)
            continue
        r = rng.random()
        if r < 0.1:
            value: dict = {"n": rng.randrange(100)}                              # no city: no entry
        elif r < 0.2:
            value = {"city": [rng.choice(CITIES), rng.choice(CITIES)]}          # multi-entry
        else:
            value = {"city": rng.choice(CITIES), "n": rng.randrange(100)}
        ops.append({"op": "set", "key": key, "value": value})
        live.add(key)
    return ops


def brute_force(url: str, keys: Iterable[str], path: str = "city") -> set[tuple[str, str, int, int]]:
    """(value, key, partition, seqno) of every entry, from GET-ing every document."""
    return brute_force_with(url, keys, FieldIndex(path))


def brute_force_with(url: str, keys: Iterable[str], fn) -> set[tuple[str, str, int, int]]:  # type: ignore[no-untyped-def]
    out = set()
    with HttpApi(url) as api:
        for key in keys:
            doc = api.get(key)
            if doc is not None:
                out |= {(v, key, doc.partition, doc.seqno) for v in fn(key, doc.value)}
    return out


def index_rows(spark, index_dir) -> set[tuple[str, str, int, int]]:  # type: ignore[no-untyped-def]
    from spark_connector.index.view import load_index
    return {(r.value, r.key, r.partition, r.seqno) for r in load_index(spark, index_dir).collect()}


def doc(city: str) -> dict:
    return {"city": city}


__all__ = ["bulk", "random_ops", "brute_force", "brute_force_with", "index_rows", "doc", "json"]
