"""The committed OpenAPI document is current and complete, and the running server keeps it
(schemathesis, a bounded number of generated requests per operation)."""
from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import schemathesis
from hypothesis import HealthCheck, settings

from app.cli import openapi_text
from tests.support.server import ServerProcess, start_server
from tests.support.auth import TOKENS

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "openapi" / "openapi.json"
UNAUTHENTICATED = {"/health", "/ready"}


def test_committed_openapi_is_not_stale() -> None:
    assert SPEC.read_text(encoding="utf-8") == openapi_text(), (
        "openapi/openapi.json is stale: run `upr openapi -o openapi/openapi.json`"
    )


def test_every_operation_is_documented() -> None:
    spec = json.loads(openapi_text())
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            where = f"{method.upper()} {path}"
            assert op.get("summary") and op.get("description"), where
            codes = set(op["responses"])
            assert any(c.startswith("2") for c in codes), where
            if path not in UNAUTHENTICATED:
                assert {"401", "403"} <= codes, where
            for code, response in op["responses"].items():
                if code.startswith(("4", "5")) and path not in UNAUTHENTICATED:
                    assert list(response["content"]) == ["application/problem+json"], (where, code)


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    srv = start_server(tmp_path_factory.mktemp("upr-schemathesis"), partitions=4, tokens=TOKENS)
    yield srv
    srv.kill()


@schemathesis.serializer("application/x-ndjson")
def _ndjson(context, value):  # type: ignore[no-untyped-def]
    """Generated NDJSON bodies are strings (the schema cannot say more): send them as-is."""
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    try:
        return orjson.dumps(value)
    except TypeError:  # e.g. integers beyond 64 bits, which orjson cannot encode
        return json.dumps(value).encode()


# The committed file (no server needed to collect), every operation, with the same per-operation
# settings as the full CLI run of docs/testing.md: openapi/schemathesis.toml says which declared
# answers differ from what schemathesis' generic checks expect, and why.
CONFIG = ROOT / "openapi" / "schemathesis.toml"
schema = schemathesis.openapi.from_path(SPEC, config=schemathesis.config.SchemathesisConfig.from_path(CONFIG))


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def _conforms(case, live: ServerProcess) -> None:  # type: ignore[no-untyped-def]
    case.call_and_validate(base_url=live.url, headers=live.headers, timeout=30)


def _test_name(label: str) -> str:
    """``test_server_conforms_to_its_schema__post_docs_bulk`` for ``POST /docs/_bulk``."""
    return "test_server_conforms_to_its_schema__" + re.sub(r"[^a-z0-9]+", "_", label.lower()).strip("_")


# One test function, and so one pytest item and node id, per operation: ``schema.parametrize()``
# gives all of an operation's cases the function's own node id, and pytest-xdist's schedulers
# key work by node id, so under ``make test`` one operation of the file ran and the others were
# dropped.  schemathesis' own builder still runs each operation's property test (explicit
# examples, coverage cases and fuzzing; positive and negative data), as its documentation allows
# (``parametrize()``'s result assigned to one name per schema).
OPERATIONS = sorted(result.ok().label for result in schema.get_all_operations())
assert len({_test_name(label) for label in OPERATIONS}) == len(OPERATIONS), "two operations share a test name"
for _label in OPERATIONS:
    # every other operation excluded: ``include()`` would add an alternative to the config's own
    # include filter (which takes them all), not narrow it
    _one = schema.exclude(name=[other for other in OPERATIONS if other != _label])
    globals()[_test_name(_label)] = pytest.mark.slow(_one.parametrize()(_conforms))
