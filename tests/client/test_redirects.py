"""``clients.redirects``: which servers a ``--server`` list names, and which 421 answers are followed."""
from __future__ import annotations

import pytest

from clients.errors import UsageError
from clients.redirects import parse_servers, redirect_target


@pytest.mark.parametrize(("text", "servers"), [
    ("http://a:1", ("http://a:1",)),
    ("http://a:1/", ("http://a:1",)),
    ("http://a:1, https://b:2/ ,", ("http://a:1", "https://b:2")),
])
def test_server_lists(text: str, servers: tuple[str, ...]) -> None:
    assert parse_servers(text) == servers


@pytest.mark.parametrize("text", ["", " , ", "a:1", "http://a:1,ftp://b"])
def test_bad_server_lists_are_usage_errors(text: str) -> None:
    with pytest.raises(UsageError):
        parse_servers(text)


HERE = "http://127.0.0.1:1"


@pytest.mark.parametrize(("status", "body", "target"), [
    (421, {"url": "http://127.0.0.1:2", "active": "n2"}, "http://127.0.0.1:2"),
    (421, {"url": "http://127.0.0.1:2/"}, "http://127.0.0.1:2"),
    (421, {"url": None, "active": None}, None),          # no active node right now: nothing to follow
    (421, {"url": HERE + "/"}, None),                     # the same node again: a loop, not a route
    (421, {"url": "javascript:alert(1)"}, None),
    (421, ["not", "a", "problem"], None),
    (421, None, None),
    (503, {"url": "http://127.0.0.1:2"}, None),          # only 421 redirects
    (200, {"url": "http://127.0.0.1:2"}, None),
])
def test_redirect_targets(status: int, body: object, target: str | None) -> None:
    assert redirect_target(status, body, HERE) == target
