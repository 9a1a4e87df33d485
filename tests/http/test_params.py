"""``app.params``: the If-Match header and the durability query parameter, table-driven."""
from __future__ import annotations

import pytest
from starlette.requests import Request

from app.params import BULK_QUERY, WRITE_QUERY, durability_of, parse_if_match
from app.problems import Problem
from engine.core.types import Durability


@pytest.mark.parametrize(
    ("header", "cas"), [(None, None), ('"123"', 123), ("123", 123), (' "5" ', 5), (str((1 << 64) - 1), (1 << 64) - 1)]
)
def test_if_match(header: str | None, cas: int | None) -> None:
    assert parse_if_match(header) == cas


@pytest.mark.parametrize("header", ["*", "W/\"1\"", "abc", '""', "-1", str(1 << 64), "١٢", "0", '"0"', "007", '"12'])
def test_if_match_rejects(header: str) -> None:
    with pytest.raises(Problem) as info:
        parse_if_match(header)
    assert info.value.status == 422 and info.value.field == "header.if-match"


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (b"", Durability.MEMORY),
        (b"durability=memory", Durability.MEMORY),
        (b"durability=persist", Durability.PERSIST),
        (b"durability=persist&durability_timeout_ms=5", Durability.PERSIST),
        (b"durability=per%73ist", Durability.PERSIST),
        (b"durability_timeout_ms=5", Durability.MEMORY),
        (b"durability=sometimes", None),
        (b"durability=", None),
        (b"durability=persist&durability=sometimes", None),
    ],
)
def test_durability_parameter(query: bytes, expected: Durability | None) -> None:
    """The whole-query shortcut answers exactly as Starlette's parsing (last value wins)."""
    request = Request({"type": "http", "method": "PUT", "path": "/docs/a", "headers": [], "query_string": query})
    if expected is None:
        with pytest.raises(Problem) as info:
            durability_of(request)
        assert info.value.field == "query.durability"
    else:
        assert durability_of(request) is expected


@pytest.mark.parametrize(
    ("query", "known", "field"),
    [
        (b"x=1", WRITE_QUERY, "query.x"),
        (b"durability=persist&x=1", WRITE_QUERY, "query.x"),
        (b"durabilty=majority", WRITE_QUERY, "query.durabilty"),
        (b"results=columns", WRITE_QUERY, "query.results"),
    ],
)
def test_unknown_query_parameters_are_refused(query: bytes, known: frozenset[str], field: str) -> None:
    """A misspelt parameter is an error, never a write at the default durability."""
    request = Request({"type": "http", "method": "PUT", "path": "/docs/a", "headers": [], "query_string": query})
    with pytest.raises(Problem) as info:
        durability_of(request, known)
    assert info.value.status == 422 and info.value.field == field


def test_a_bulk_write_knows_results() -> None:
    request = Request({"type": "http", "method": "POST", "path": "/docs/_bulk", "headers": [],
                       "query_string": b"results=columns&durability=persist"})
    assert durability_of(request, BULK_QUERY) is Durability.PERSIST
