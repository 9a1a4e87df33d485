"""``app.params.bulk_query_of``: the bulk's query parsed once per distinct text, the same answers
and problems as the three parsers it stands for, and a table that a varying client cannot grow."""
from __future__ import annotations

import pytest
from starlette.requests import Request

from app import params
from app.problems import Problem
from engine.core.types import Durability


def _request(query: bytes) -> Request:
    return Request({"type": "http", "method": "POST", "path": "/docs/_bulk", "query_string": query, "headers": []})


@pytest.mark.parametrize("query, expected", [
    (b"", (Durability.MEMORY, 2.5, False)),
    (b"durability=persist&results=columns", (Durability.PERSIST, 2.5, True)),
    (b"results=objects&durability_timeout_ms=40", (Durability.MEMORY, 0.04, False)),
    (b"durability=majority", (Durability.MAJORITY, 2.5, False)),
])
def test_the_same_answer_as_the_three_parsers_first_and_second_time(query: bytes, expected: tuple) -> None:
    request = _request(query)
    separate = (params.durability_of(request, params.BULK_QUERY), params.durability_timeout_of(request, 2500),
                params.columns_wanted(request))
    assert separate == expected
    assert params.bulk_query_of(_request(query), 2500) == expected
    assert params.bulk_query_of(_request(query), 2500) == expected


@pytest.mark.parametrize("query, field", [
    (b"durabilty=majority", "query.durabilty"),
    (b"durability=always", "query.durability"),
    (b"results=rows", "query.results"),
    (b"durability_timeout_ms=0", "query.durability_timeout_ms"),
])
def test_a_bad_query_is_refused_every_time(query: bytes, field: str) -> None:
    for _ in range(2):
        with pytest.raises(Problem) as caught:
            params.bulk_query_of(_request(query), 2500)
        assert caught.value.field == field


def test_the_table_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(params, "_BULK_QUERIES", {})
    for i in range(params.BULK_QUERIES_KEPT * 3):
        assert params.bulk_query_of(_request(b"durability_timeout_ms=%d" % (i + 1)), 2500)[1] == (i + 1) / 1000
    assert len(params._BULK_QUERIES) == params.BULK_QUERIES_KEPT
