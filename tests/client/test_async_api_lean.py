"""``AsyncHttpApi`` on a real server: the lean keep-alive transport and httpx give the same answers
and the same typed errors, for bulk writes (both durabilities, both result forms, NDJSON) and
single documents."""
from __future__ import annotations

import pytest

from clients.errors import AuthFailed, HttpError
from clients.http import AsyncHttpApi


def _shape(out: dict) -> dict:
    """A bulk answer without what differs between two runs (CAS, seqno)."""
    if "columns" in out:
        cols = out["columns"]
        return {**out, "columns": {k: v for k, v in cols.items() if k not in ("cas", "seqno", "rev")}}
    return {**out, "results": [{k: v for k, v in r.items() if k not in ("cas", "seqno", "rev")}
                               for r in out["results"]]}


async def test_lean_and_httpx_answer_alike(upr_server) -> None:
    srv = upr_server(partitions=4, tokens={"adm-token-1": "admin", "read-token-1": "read"})
    answers = {}
    for lean in (True, False):
        api = AsyncHttpApi(srv.url, "adm-token-1", timeout=30, lean=lean)
        tag = "lean" if lean else "httpx"
        ops = [{"op": "set", "key": f"k-{i}", "value": {"i": i}} for i in range(10)]
        got = [_shape(await api.bulk(ops, durability="persist")),
               _shape(await api.bulk(ops, durability="memory", columns=True)),
               _shape(await api.bulk([{"op": "delete", "key": "k-0"}, {"op": "delete", "key": "k-0"},
                                      {"op": "nope"}], ndjson=True))]
        put = await api.put(f"{tag}/a b", b"\xff\x00", durability="persist")
        doc = await api.get(f"{tag}/a b")
        assert doc is not None and doc.value == b"\xff\x00" and doc.seqno == put["seqno"]
        assert await api.get("missing") is None
        with pytest.raises(HttpError) as info:
            await api.put(f"{tag}/a b", b"x", cas=put["cas"] + 1)
        assert info.value.status == 412
        await api.delete(f"{tag}/a b")
        assert await api.get(f"{tag}/a b") is None
        assert (await api.status())["partitions"] == 4
        with pytest.raises(HttpError) as info:
            await api.bulk_bytes(b"[not json")
        assert info.value.status == 422 and info.value.server_code == "invalid-input"
        await api.aclose()
        reader = AsyncHttpApi(srv.url, "read-token-1", lean=lean)
        with pytest.raises(AuthFailed):
            await reader.bulk(ops)
        await reader.aclose()
        answers[tag] = got
    assert answers["lean"] == answers["httpx"]
