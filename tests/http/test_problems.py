"""``app.problems``: every engine error maps to a problem type with the right status."""
from __future__ import annotations

import pytest

from app.problems import ENGINE_PROBLEMS, Problem, problem_type_of
from engine.core import errors as E


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
