"""Pure logic of the HTTP layer, table-driven: bulk items, If-Match, tokens, binding, settings, problems."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import orjson
import pytest
from fastapi import APIRouter, BackgroundTasks, Depends
from starlette.requests import Request
from starlette.responses import Response

from app import bulk
from app.auth import AuthError, Role, TokenConfigError, TokenTable, authorize, check_bind, is_loopback
from app.params import durability_of, parse_if_match
from app.plain import serve_plainly
from app.problems import ENGINE_PROBLEMS, INVALID_INPUT, Problem, problem_type_of
from app.routes.status import RateSampler
from app.settings import ConfigFileError, Settings
from engine.core import errors as E
from engine.core.types import Durability, Op, WriteOp


# ------------------------------------------------------------------ bulk items
@pytest.mark.parametrize(
    ("item", "expected"),
    [
        ({"op": "set", "key": "a", "value": {"x": 1}}, WriteOp(Op.MUTATION, "a", b'{"x":1}')),
        ({"op": "set", "key": "a", "value": "s"}, WriteOp(Op.MUTATION, "a", b'"s"')),
        ({"op": "set", "key": "a", "value": None}, WriteOp(Op.MUTATION, "a", b"null")),
        ({"op": "set", "key": "a", "value_b64": base64.b64encode(b"\x00\xff").decode()},
         WriteOp(Op.MUTATION, "a", b"\x00\xff")),
        ({"op": "set", "key": "a", "value": 1, "cas": 7}, WriteOp(Op.MUTATION, "a", b"1", 7)),
        ({"op": "delete", "key": "a"}, WriteOp(Op.DELETION, "a", b"")),
        ({"op": "delete", "key": "a", "cas": 3}, WriteOp(Op.DELETION, "a", b"", 3)),
    ],
)
def test_valid_items(item: dict, expected: WriteOp) -> None:
    assert bulk.to_op(0, item) == expected


@pytest.mark.parametrize(
    ("item", "field", "words"),
    [
        ([1, 2], "[4]", "must be an object"),
        ({"op": "set", "key": "a"}, "[4].value", "needs value or value_b64"),
        ({"op": "set", "key": "a", "value": 1, "value_b64": "AA=="}, "[4].value_b64", "not both"),
        ({"op": "set", "key": "a", "value_b64": "***"}, "[4].value_b64", "not valid base64"),
        ({"op": "set", "key": "a", "value_b64": 5}, "[4].value_b64", "base64 string"),
        ({"op": "set", "key": 5, "value": 1}, "[4].key", "key must be a string"),
        ({"op": "upsert", "key": "a", "value": 1}, "[4].op", 'op must be "set" or "delete"'),
        ({"key": "a", "value": 1}, "[4].op", "op must be"),
        ({"op": "delete", "key": "a", "value": 1}, "[4].value", "delete takes no value"),
        ({"op": "set", "key": "a", "value": 1, "cas": -1}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "cas": "12"}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "cas": True}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "cas": 1 << 64}, "[4].cas", "unsigned 64-bit"),
        ({"op": "set", "key": "a", "value": 1, "ttl": 3}, "[4]", "unknown field(s) ttl"),
    ],
)
def test_invalid_items(item: object, field: str, words: str) -> None:
    problem = bulk.to_op(4, item)
    assert isinstance(problem, Problem)
    assert problem.status == 422
    assert problem.field == field
    assert words in problem.detail


@pytest.mark.parametrize(
    ("content_type", "body", "ndjson"),
    [
        ("application/x-ndjson", b"[1]", True),
        ("application/jsonl", b"{}", True),
        ("application/json", b"{}\n{}", False),
        (None, b"  [ {} ]", False),
        (None, b'{"op":"set"}\n', True),
        ("application/octet-stream", b"[]", False),
        ("text/plain", b"{}", True),
    ],
)
def test_ndjson_detection(content_type: str | None, body: bytes, ndjson: bool) -> None:
    assert bulk.is_ndjson(content_type, body) is ndjson


def test_ndjson_bad_line_is_its_own_error() -> None:
    items = bulk.parse_items(b'{"a":1}\n\n{oops\r\n{"b":2}\r\n', ndjson=True, max_items=10)
    assert items[0] == {"a": 1} and items[2] == {"b": 2}
    assert isinstance(items[1], Problem) and items[1].field == "line 3"


@pytest.mark.parametrize(
    ("body", "ndjson", "status"),
    [(b"[1,", False, 422), (b'{"a":1}', False, 422), (b"[" + b"{}," * 3 + b"{}]", False, 413),
     (b"{}\n" * 5, True, 413)],
)
def test_whole_body_errors(body: bytes, ndjson: bool, status: int) -> None:
    with pytest.raises(Problem) as info:
        bulk.parse_items(body, ndjson, max_items=3)
    assert info.value.status == status


class _FakeBatchWriter:
    """Only for the pure ``apply`` bookkeeping; real engine behaviour is tested end to end."""

    def write_batch(self, ops):  # type: ignore[no-untyped-def]
        from engine.core.types import WriteResult

        out = []
        for i, (kind, key, _value, _cas) in enumerate(ops):  # WriteOps or plain tuples, as the engine takes
            if key == "bad":
                out.append(E.CasMismatch("nope", expected=1, actual=2, field="cas", partition=0))
            else:
                out.append(WriteResult(key, len(key) % 2, 10 + i, 99, 1, kind is Op.DELETION))
        return out


def test_apply_keeps_order_and_targets_highest_seqno_per_partition() -> None:
    items = [{"op": "set", "key": "a", "value": 1}, {"op": "nope"}, {"op": "set", "key": "bad", "value": 1, "cas": 1},
             {"op": "delete", "key": "cc"}, {"op": "set", "key": "e", "value": 2}]
    body, targets = bulk.apply(_FakeBatchWriter(), bulk.batch_of(items), "persist")
    assert [r["status"] for r in body["results"]] == [200, 422, 409, 200, 200]
    assert [r["index"] for r in body["results"]] == [0, 1, 2, 3, 4]
    assert body["succeeded"] == 3 and body["failed"] == 2
    assert body["results"][2]["error"]["type"].endswith("/cas-mismatch")
    assert targets == {1: 13, 0: 12}
    orjson.dumps(body)


# ------------------------------------------------------------------ If-Match
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


# ------------------------------------------------------------------ auth
TABLE = TokenTable([("reader-token-1", Role.READ, "r"), ("writer-token-1", Role.WRITE, "w"),
                    ("admin-token-01", Role.ADMIN, "a")])


@pytest.mark.parametrize(
    ("token", "role", "outcome"),
    [
        ("reader-token-1", Role.READ, "r"),
        ("reader-token-1", Role.WRITE, 403),
        ("writer-token-1", Role.WRITE, "w"),
        ("writer-token-1", Role.ADMIN, 403),
        ("admin-token-01", Role.ADMIN, "a"),
        ("admin-token-01", Role.READ, "a"),
        ("admin-token-0", Role.READ, 401),
        ("", Role.READ, 401),
        (None, Role.READ, 401),
    ],
)
def test_authorize(token: str | None, role: Role, outcome: str | int) -> None:
    if isinstance(outcome, int):
        with pytest.raises(AuthError) as info:
            authorize(TABLE, token, role)
        assert info.value.status == outcome
    else:
        assert authorize(TABLE, token, role).name == outcome


def test_protected_mode_admits_loopback_only() -> None:
    empty = TokenTable()
    assert authorize(empty, None, Role.ADMIN, client_host="127.0.0.1").role is Role.ADMIN
    assert authorize(empty, None, Role.ADMIN, client_host="::1").role is Role.ADMIN
    with pytest.raises(AuthError):
        authorize(empty, None, Role.READ, client_host="10.1.2.3")


@pytest.mark.parametrize(
    ("host", "has_tokens", "refused"),
    [("127.0.0.1", False, False), ("localhost", False, False), ("::1", False, False), ("127.3.4.5", False, False),
     ("0.0.0.0", False, True), ("::", False, True), ("192.168.1.5", False, True), ("example.com", False, True),
     ("0.0.0.0", True, False)],
)
def test_check_bind(host: str, has_tokens: bool, refused: bool) -> None:
    tokens = TABLE if has_tokens else TokenTable()
    reason = check_bind(host, tokens)
    assert (reason is not None) is refused
    if reason:
        assert "\n" not in reason and host in reason
    assert is_loopback(host) is (not refused or has_tokens) or has_tokens


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("t.toml", '[tokens]\n"tok-read-0001" = "read"\n"tok-admin-001" = "admin"\n'),
        ("t.toml", '[[tokens]]\ntoken = "tok-read-0001"\nrole = "read"\n[[tokens]]\ntoken = "tok-admin-001"\nrole = "ADMIN"\n'),
        ("t.json", json.dumps({"tokens": {"tok-read-0001": "read", "tok-admin-001": "admin"}})),
        ("t.json", json.dumps([{"token": "tok-read-0001", "role": "read"}, {"token": "tok-admin-001", "role": "admin"}])),
    ],
)
def test_token_files(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    table = TokenTable.load(path)
    assert len(table) == 2
    assert table.lookup("tok-read-0001").role is Role.READ  # type: ignore[union-attr]
    assert table.lookup("tok-admin-001").role is Role.ADMIN  # type: ignore[union-attr]
    assert table.lookup("tok-admin-00") is None


@pytest.mark.parametrize(
    ("inline", "count"),
    [("tok-read-0001=read,tok-write-001=write", 2), ('{"tok-a-000001": "admin"}', 1), ("", 0)],
)
def test_inline_tokens(inline: str, count: int) -> None:
    assert len(TokenTable.load(None, inline)) == count


@pytest.mark.parametrize(
    "inline", ["short=read", "tok-read-0001=owner", "tok-read-0001", "{not json", "tok-read-0001=read,tok-read-0001=admin"]
)
def test_bad_tokens(inline: str) -> None:
    with pytest.raises(TokenConfigError):
        TokenTable.load(None, inline)


# ------------------------------------------------------------------ settings
def test_settings_precedence(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "upr.toml"
    cfg.write_text('[server]\nport = 9001\npartitions = 16\nflush_interval_ms = 7\n')
    monkeypatch.setenv("UPR_PARTITIONS", "32")
    s = Settings(config_file=cfg, flush_interval_ms=9)
    assert (s.port, s.partitions, s.flush_interval_ms) == (9001, 32, 9)  # toml < env < flag
    assert s.host == "127.0.0.1" and s.data_dir == Path("./data")
    assert s.engine_config().partitions == 32


def test_settings_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(__import__("os").environ):
        if name.startswith("UPR_"):
            monkeypatch.delenv(name)
    s = Settings()
    assert (s.data_dir, s.host, s.port, s.partitions, s.flush_interval_ms) == (Path("./data"), "127.0.0.1", 8000, 64, 5)


@pytest.mark.parametrize("text", ["port = 1\nprot = 2\n", "port = [", "[server]\nflush = 1\n"])
def test_config_file_errors(tmp_path: Path, text: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(text)
    with pytest.raises(ConfigFileError):
        Settings(config_file=cfg)


def test_config_file_missing(tmp_path: Path) -> None:
    with pytest.raises(ConfigFileError):
        Settings(config_file=tmp_path / "nope.toml")


# ------------------------------------------------------------------ problems
@pytest.mark.parametrize(
    ("exc", "status", "slug"),
    [
        (E.InvalidKey("k"), 422, "invalid-key"),
        (E.InvalidPartition("p"), 422, "invalid-partition"),
        (E.InvalidInput("i"), 422, "invalid-input"),
        (E.TooLarge("t"), 413, "too-large"),
        (E.KeyNotFound("n"), 404, "key-not-found"),
        (E.CasMismatch("c"), 412, "cas-mismatch"),
        (E.PartitionNotActive("p", partition=3), 503, "partition-not-active"),
        (E.Backpressure("b"), 429, "backpressure"),
        (E.SeqnoRangeError("s"), 416, "seqno-range"),
        (E.EngineClosed("c"), 503, "engine-closed"),
        (type("Future", (E.KeyNotFound,), {})("sub"), 404, "key-not-found"),
    ],
)
def test_engine_error_mapping(exc: E.UprError, status: int, slug: str) -> None:
    problem = Problem.from_engine(exc)
    body = problem.body("/x")
    assert (body["status"], body["type"]) == (status, "https://upr.dev/problems/" + slug)
    assert body["code"] == exc.code and body["detail"] == exc.message
    if exc.partition is not None:
        assert body["partition"] == exc.partition
    if exc.retriable and status in (429, 503):
        assert problem.headers["Retry-After"] == "1"


def test_every_engine_error_class_is_mapped() -> None:
    def subclasses(cls: type) -> list[type]:
        return [cls] + [s for c in cls.__subclasses__() for s in subclasses(c)]

    for cls in subclasses(E.UprError):
        if cls.__module__ == "engine.core.errors":
            assert cls in ENGINE_PROBLEMS, cls
            assert problem_type_of(cls("x")).status != 500 or cls is E.UprError


def test_rate_sampler() -> None:
    s = RateSampler(window=1.0)
    assert s.update(0, 10.0) == 0.0
    assert s.update(5, 10.5) == 0.0
    assert s.update(20, 12.0) == 10.0
    assert s.update(21, 12.1) == 10.0


@pytest.mark.parametrize("items", [
    [{"op": "set", "key": "a", "value": 1}, {"op": "nope"}, {"op": "set", "key": "bad", "value": 1, "cas": 1},
     {"op": "delete", "key": "cc"}, {"op": "set", "key": "e", "value": 2}],
    [{"op": "set", "key": "a", "value": 1}, {"op": "set", "key": "bb", "value": 2}],
    [{"op": "set", "key": "a", "value": 1}, {"op": "set", "key": "bad", "value": 2}],
    [{"op": "nope"}],
    [],
])
def test_columns_say_what_each_item_got_as_the_objects_do(items: list[object]) -> None:
    """``results=columns`` carries the per-item outcome of the objects form: element i of every
    column is item i's; failed items have null fields and an entry in ``errors``."""
    objects, targets = bulk.apply(_FakeBatchWriter(), bulk.batch_of(items), "persist")
    columns, targets2 = bulk.apply(_FakeBatchWriter(), bulk.batch_of(items), "persist", columns=True)
    assert targets == targets2
    assert (columns["succeeded"], columns["failed"], columns["durability"]) == (
        objects["succeeded"], objects["failed"], "persist")
    cols = orjson.loads(orjson.dumps(columns))["columns"]
    assert set(cols) == {"status", "partition", "seqno", "cas", "rev", "deleted"}
    assert all(len(col) == len(items) for col in cols.values())
    for i, res in enumerate(objects["results"]):
        assert cols["status"][i] == res["status"]
        for name in ("partition", "seqno", "cas", "rev", "deleted"):
            assert cols[name][i] == res.get(name)
    assert columns["errors"] == [r for r in objects["results"] if r["status"] != 200]


async def test_write_durable_settles_once_both_are_done() -> None:
    """``runner.write_durable``: the result once the persist future is done; its error, the call's
    error, or a cancelled persist future reach the caller (never a hang)."""
    import concurrent.futures

    from app.runner import EngineRunner

    runner = EngineRunner(engine=None)  # type: ignore[arg-type]
    try:
        assert await runner.write_durable(lambda: (1, None)) == 1
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)
        assert await runner.write_durable(lambda: (2, done)) == 2
        failed: concurrent.futures.Future[None] = concurrent.futures.Future()
        failed.set_exception(OSError("disk"))
        with pytest.raises(OSError):
            await runner.write_durable(lambda: (3, failed))
        cancelled: concurrent.futures.Future[None] = concurrent.futures.Future()
        cancelled.cancel()
        with pytest.raises(concurrent.futures.CancelledError):
            await runner.write_durable(lambda: (4, cancelled))

        def boom() -> tuple[int, None]:
            raise Problem(INVALID_INPUT, "bad", field="body")
        with pytest.raises(Problem):
            await runner.write_durable(boom)
    finally:
        runner.shutdown()


# ------------------------------------------------------------------ durability query parameter
@pytest.mark.parametrize(
    ("query", "expected"),
    [
        (b"", Durability.MEMORY),
        (b"durability=memory", Durability.MEMORY),
        (b"durability=persist", Durability.PERSIST),
        (b"x=1&durability=persist", Durability.PERSIST),
        (b"durability=persist&x=1", Durability.PERSIST),
        (b"durability=per%73ist", Durability.PERSIST),
        (b"x=1", Durability.MEMORY),
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


# ------------------------------------------------------------------ plain routes
async def _with_query(request: Request, limit: int = 1) -> None: ...


async def _with_response(request: Request, response: Response) -> None: ...


async def _with_tasks(request: Request, tasks: BackgroundTasks) -> None: ...


def _sync(request: Request) -> None: ...


async def _no_request() -> None: ...


@pytest.mark.parametrize("endpoint", [_with_query, _with_response, _with_tasks, _sync, _no_request])
def test_serve_plainly_refuses_what_it_cannot_serve(endpoint: object) -> None:
    """A route served plainly gets no dependency solving and no thread pool, so an endpoint
    that declares anything but the request (or is not ``async``) would fail at request time:
    it is refused when the route is set up."""
    router = APIRouter()
    router.add_api_route("/x", endpoint, methods=["GET"])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="must (take only the Request|be an async def)"):
        serve_plainly(router.routes)


def test_serve_plainly_refuses_router_dependencies() -> None:
    async def needs(request: Request) -> None: ...

    async def endpoint(request: Request) -> None: ...

    router = APIRouter(dependencies=[Depends(needs)])
    router.add_api_route("/x", endpoint, methods=["GET"])
    with pytest.raises(TypeError, match="no dependencies"):
        serve_plainly(router.routes)


def test_document_routes_are_served_plainly_in_the_app() -> None:
    """Checked on the app's own routes (an ``include_router`` would copy the routes and drop the swap)."""
    from app.main import create_app

    app = create_app(Settings.model_construct(), tokens=TokenTable())
    docs = [r for r in app.routes if getattr(r, "path", "") == "/docs/{key:doc_key}"]
    assert sorted(m for r in docs for m in r.methods) == ["DELETE", "GET", "PUT"]
    assert {r.app.__qualname__ for r in docs} == {"plain.<locals>.app"}
