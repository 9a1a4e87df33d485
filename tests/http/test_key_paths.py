"""A key in a URL path is its percent-decoded bytes, refused unless they are UTF-8: the server
decodes escapes with replacement, so without the strict reading ``alias%FEx``, ``alias%FFx`` and
``alias%EF%BF%BDx`` were one document (each write silently overwrote the others)."""
from __future__ import annotations

import httpx
import pytest

from tests.support.problems import problem

BAD = ["alias%FEx", "alias%FFx", "%C3", "a%ED%A0%80b", "%C0%AF", "ok%E2%82"]  # not UTF-8 (or lone surrogate)


@pytest.mark.parametrize("path", BAD)
def test_a_key_that_is_not_utf8_is_refused_by_every_document_route(client: httpx.Client, path: str) -> None:
    for method in ("PUT", "GET", "DELETE"):
        r = client.request(method, "/docs/" + path, content=b"v" if method == "PUT" else None)
        body = problem(r, 422, "invalid-key")
        assert "UTF-8" in body["detail"], (method, body)


def test_the_replacement_character_itself_is_an_ordinary_key(client: httpx.Client) -> None:
    """``%EF%BF%BD`` is valid UTF-8 (U+FFFD): a key of its own, which the bad bytes no longer alias."""
    assert client.put("/docs/alias%EF%BF%BDx", content=b"real").status_code == 200
    for bad in ("alias%FEx", "alias%FFx"):
        problem(client.put("/docs/" + bad, content=b"overwrite"), 422, "invalid-key")
        problem(client.get("/docs/" + bad), 422, "invalid-key")
    r = client.get("/docs/alias%EF%BF%BDx")
    assert r.status_code == 200 and r.content == b"real"
    assert client.get("/docs/alias\ufffdx").content == b"real"


def test_valid_escapes_still_name_their_key(client: httpx.Client) -> None:
    assert client.put("/docs/caf%C3%A9%2Fx%0A", content=b"1").status_code == 200
    assert client.get("/docs/caf%C3%A9%2Fx%0A").content == b"1"
    assert client.get("/docs/café%2Fx%0A").content == b"1"


def test_bulk_applies_the_same_key_rule(client: httpx.Client) -> None:
    """The JSON text of such a key (a lone surrogate escape) is refused: the array as a whole, an
    NDJSON line alone."""
    body = b'[{"op":"set","key":"alias\\udcfex","value":1},{"op":"set","key":"alias\\ufffdx","value":2}]'
    r = client.post("/docs/_bulk", content=body, headers={"content-type": "application/json"})
    problem(r, 422, "invalid-input")  # not valid JSON text: the whole array is refused, nothing written
    ndjson = b'{"op":"set","key":"alias\\udcfex","value":1}\n{"op":"set","key":"b","value":2}\n'
    r = client.post("/docs/_bulk", content=ndjson, headers={"content-type": "application/x-ndjson"})
    results = r.json()["results"]
    assert results[0]["status"] == 422 and [res["status"] for res in results[1:]] == [200]
    assert client.get("/docs/alias%EF%BF%BDx").content == b"real"
