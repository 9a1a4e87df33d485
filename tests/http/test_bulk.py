"""POST /docs/_bulk end to end: JSON arrays and NDJSON, value vs value_b64, partial failures."""
from __future__ import annotations

import base64

import httpx
import orjson
import pytest

from tests.support.keys import key_in
from tests.support.problems import problem

pytestmark = pytest.mark.slow


def ndjson(*items: object) -> bytes:
    return b"\n".join(orjson.dumps(i) for i in items) + b"\n"


@pytest.mark.parametrize("form", ["array", "ndjson"])
def test_bulk_values_and_partial_failures(client: httpx.Client, form: str) -> None:
    existing = client.put(f"/docs/{form}-cas", content=b"old").json()
    items = [
        {"op": "set", "key": f"{form}-json", "value": {"name": "ada", "n": [1, 2]}},
        {"op": "set", "key": f"{form}-bin", "value_b64": base64.b64encode(b"\x00\x01\xfe").decode()},
        {"op": "set", "key": f"{form}-cas", "value": "new", "cas": existing["cas"] + 1},   # CAS mismatch
        {"op": "delete", "key": f"{form}-missing"},                                         # not found
        {"op": "set", "key": f"{form}-both", "value": 1, "value_b64": "AA=="},              # invalid
        {"op": "set", "key": "", "value": 1},                                               # invalid key
        {"op": "set", "key": f"{form}-str", "value": "plain"},
    ]
    if form == "array":
        r = client.post("/docs/_bulk", content=orjson.dumps(items), headers={"content-type": "application/json"})
    else:
        r = client.post("/docs/_bulk", content=ndjson(*items), headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    body = r.json()
    statuses = [x["status"] for x in body["results"]]
    assert statuses == [200, 200, 409, 404, 422, 422, 200]
    assert (body["succeeded"], body["failed"]) == (3, 4)
    assert [x["index"] for x in body["results"]] == list(range(7))
    cas_err = body["results"][2]["error"]
    assert cas_err["type"] == "https://upr.dev/problems/cas-mismatch" and cas_err["status"] == 409
    assert body["results"][4]["error"]["field"] == "[4].value_b64"
    assert body["results"][5]["error"]["type"].endswith("/invalid-key")
    ok = body["results"][0]
    assert {"partition", "seqno", "cas", "rev"} <= set(ok)
    # values: JSON stored as its JSON text, binary as the decoded bytes; failed items changed nothing
    assert orjson.loads(client.get(f"/docs/{form}-json").content) == {"name": "ada", "n": [1, 2]}
    assert client.get(f"/docs/{form}-bin").content == b"\x00\x01\xfe"
    assert client.get(f"/docs/{form}-str").content == b'"plain"'
    assert client.get(f"/docs/{form}-cas").content == b"old"
    assert client.get(f"/docs/{form}-both").status_code == 404


def test_ndjson_bad_line_fails_alone_and_sniffing(client: httpx.Client) -> None:
    body = b'{"op":"set","key":"nd-a","value":1}\n{"op":"set",\n\n{"op":"set","key":"nd-b","value":2}'
    r = client.post("/docs/_bulk", content=body)  # no content type: sniffed as NDJSON
    res = r.json()["results"]
    assert [x["status"] for x in res] == [200, 422, 200]
    assert res[1]["error"]["field"] == "line 2"


def test_bulk_persist_one_wait_covers_all(client: httpx.Client) -> None:
    items = [{"op": "set", "key": key_in(p, f"bp{p}-"), "value": p} for p in range(8)]
    r = client.post("/docs/_bulk?durability=persist", content=orjson.dumps(items))
    body = r.json()
    assert body["durability"] == "persist" and body["succeeded"] == 8
    parts = {p["partition"]: p for p in client.get("/partitions").json()["partitions"]}
    for res in body["results"]:
        assert parts[res["partition"]]["persisted_seqno"] >= res["seqno"]


def test_cas_chain_within_one_batch(client: httpx.Client) -> None:
    first = client.post("/docs/_bulk", content=orjson.dumps([{"op": "set", "key": "chain", "value": 1}])).json()
    cas = first["results"][0]["cas"]
    r = client.post("/docs/_bulk", content=orjson.dumps([
        {"op": "set", "key": "chain", "value": 2, "cas": cas},
        {"op": "set", "key": "chain", "value": 3, "cas": cas},   # stale after the previous item
    ])).json()
    assert [x["status"] for x in r["results"]] == [200, 409]
    assert client.get("/docs/chain").content == b"2"


@pytest.mark.parametrize(
    ("body", "status", "slug"),
    [(b"[{", 422, "invalid-input"), (b'{"op":"set"} garbage', 200, None), (b'"just a string"', 200, None),
     (b'{"a": 1}', 200, None)],
)
def test_whole_request_errors(client: httpx.Client, body: bytes, status: int, slug: str | None) -> None:
    ct = {"content-type": "application/json"} if body.startswith(b"[") else {}
    r = client.post("/docs/_bulk", content=body, headers=ct)
    if slug:
        problem(r, status, slug)
    else:  # NDJSON: a single bad line is a per-item error
        assert r.status_code == 200 and r.json()["failed"] == 1


def test_json_body_that_is_not_an_array(client: httpx.Client) -> None:
    r = client.post("/docs/_bulk", content=b'{"op":"set","key":"x","value":1}',
                    headers={"content-type": "application/json"})
    assert problem(r, 422, "invalid-input")["field"] == "body"


def test_empty_batch(client: httpx.Client) -> None:
    r = client.post("/docs/_bulk?durability=persist", content=b"[]", headers={"content-type": "application/json"})
    assert r.json() == {"durability": "persist", "succeeded": 0, "failed": 0, "results": []}


@pytest.mark.parametrize("form", ["array", "ndjson"])
def test_results_as_columns(client: httpx.Client, form: str) -> None:
    """``?results=columns`` reports what each item got, as the objects do, one array per field."""
    from clients.http import HttpApi

    existing = client.put(f"/docs/col-{form}-cas", content=b"old").json()
    items = [
        {"op": "set", "key": f"col-{form}-a", "value": {"n": 1}},
        {"op": "set", "key": f"col-{form}-cas", "value": 2, "cas": existing["cas"] + 1},  # CAS mismatch
        {"op": "set", "key": f"col-{form}-b", "value_b64": "AAE="},
        {"op": "oops", "key": f"col-{form}-c"},                                              # invalid
    ]
    with HttpApi(str(client.base_url)) as api:
        body = api.bulk(items, durability="persist", ndjson=form == "ndjson", columns=True)
    cols = body["columns"]
    assert (body["succeeded"], body["failed"], body["durability"]) == (2, 2, "persist")
    assert cols["status"] == [200, 409, 200, 422]
    assert cols["partition"][1] is None and cols["seqno"][3] is None
    assert [e["index"] for e in body["errors"]] == [1, 3]
    assert body["errors"][0]["error"]["type"].endswith("/cas-mismatch")
    doc = client.get(f"/docs/col-{form}-b")
    assert doc.content == b"\x00\x01"
    assert [int(doc.headers["x-upr-partition"]), int(doc.headers["x-upr-seqno"]), int(doc.headers["x-upr-cas"]),
            int(doc.headers["x-upr-rev"])] == [cols[f][2] for f in ("partition", "seqno", "cas", "rev")]
    assert cols["deleted"] == [False, None, False, None]


def test_results_format_is_checked(client: httpx.Client) -> None:
    r = client.post("/docs/_bulk?results=rows", content=b"[]", headers={"content-type": "application/json"})
    assert problem(r, 422, "invalid-input")["field"] == "query.results"
    r = client.post("/docs/_bulk?results=columns", content=b"[]", headers={"content-type": "application/json"})
    assert r.json() == {"durability": "memory", "succeeded": 0, "failed": 0, "errors": [],
                        "columns": {"status": [], "partition": [], "seqno": [], "cas": [], "rev": [], "deleted": []}}


@pytest.mark.parametrize("form", ["array", "ndjson"])
def test_plain_value_batch_stores_text_as_sent_and_names_failed_keys(client: httpx.Client, form: str) -> None:
    """A batch of only plain ``value`` sets (the msgspec path): each value is stored as the text
    the client sent; an item the engine refuses (an empty key) still gets its own error."""
    items = [b'{"op":"set","key":"raw-%s","value": {"a" : [1, 2.0]} }' % form.encode(),
             b'{"op":"set","key":"","value":1}']
    body = b"\n".join(items) if form == "ndjson" else b"[" + b",".join(items) + b"]"
    res = client.post("/docs/_bulk", content=body).json()
    assert [r["status"] for r in res["results"]] == [200, 422]
    assert res["results"][1]["key"] == "" and res["results"][1]["error"]["type"].endswith("/invalid-key")
    assert client.get(f"/docs/raw-{form}").content == b'{"a" : [1, 2.0]}'
