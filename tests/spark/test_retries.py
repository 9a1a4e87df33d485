"""Retries of a trigger's metadata fetch and stream connect (``fetchOffset.*``, as Kafka's source)."""
from __future__ import annotations

import time

import pytest

from spark_connector.options import OptionError, parse_options
from spark_connector.retry import MAX_DELAY_S, Retryable, RetryPolicy, SourceUnavailable, call_with_retries
from tests.spark.helpers import bulk

S = "http://127.0.0.1:1"


@pytest.mark.parametrize("policy, expect", [
    (RetryPolicy(0, 1.0), []),
    (RetryPolicy(3, 1.0), [1.0, 2.0, 4.0]),
    (RetryPolicy(2, 0.25), [0.25, 0.5]),
    (RetryPolicy(8, 10.0), [10.0, 20.0] + [MAX_DELAY_S] * 6),
])
def test_backoff_doubles_from_the_interval_up_to_the_cap(policy, expect):
    assert list(policy.delays()) == expect


@pytest.mark.parametrize("failures, retries, outcome, slept", [
    (0, 3, "ok", []),
    (2, 3, "ok", [1.0, 2.0]),
    (3, 3, "ok", [1.0, 2.0, 4.0]),
    (4, 3, "gave up after 4 attempts", [1.0, 2.0, 4.0]),
    (1, 0, "gave up after 1 attempt in", []),
])
def test_call_with_retries(failures, retries, outcome, slept):
    calls, waits = [], []

    def attempt() -> str:
        calls.append(1)
        if len(calls) <= failures:
            raise Retryable("cannot reach http://x: Connection refused")
        return "ok"

    policy = RetryPolicy(retries, 1.0)
    if outcome == "ok":
        assert call_with_retries("GET /partitions from http://x", attempt, policy, waits.append) == "ok"
    else:
        with pytest.raises(SourceUnavailable, match=f"GET /partitions from http://x: cannot reach .*refused; {outcome}") \
                as info:
            call_with_retries("GET /partitions from http://x", attempt, policy, waits.append)
        assert f"(fetchOffset.numRetries={retries}, fetchOffset.retryIntervalMs=1000)" in str(info.value)
    assert waits == slept


def test_a_refusal_is_not_retried():
    calls = []

    def attempt() -> None:
        calls.append(1)
        raise OptionError("token", "HTTP 401")

    with pytest.raises(OptionError):
        call_with_retries("GET /partitions", attempt, RetryPolicy(5, 0.01), lambda s: None)
    assert calls == [1]


@pytest.mark.parametrize("opts, expect", [
    ({}, RetryPolicy(3, 1.0)),
    ({"fetchOffset.numRetries": "0"}, RetryPolicy(0, 1.0)),
    ({"FETCHOFFSET.RETRYINTERVALMS": "250", "fetchoffset.numretries": "7"}, RetryPolicy(7, 0.25)),
])
def test_retry_options(opts, expect):
    assert parse_options({"server": S, **opts}).retry == expect


@pytest.mark.parametrize("opts, option", [
    ({"fetchOffset.numRetries": "-1"}, "fetchOffset.numRetries"),
    ({"fetchOffset.retryIntervalMs": "soon"}, "fetchOffset.retryIntervalMs"),
])
def test_bad_retry_options_name_the_option(opts, option):
    with pytest.raises(OptionError, match=f"option '{option}'"):
        parse_options({"server": S, **opts})


@pytest.mark.slow
def test_query_survives_a_server_restart_longer_than_a_trigger_interval(spark, upr_server, tmp_path):
    from urllib.parse import urlparse
    srv = upr_server(partitions=4)
    port = urlparse(srv.url).port
    bulk(srv.url, [{"op": "set", "key": f"a{i}", "value": 1} for i in range(100)], durability="persist")
    seen: set[str] = set()
    q = (spark.readStream.format("upr").option("server", srv.url)
         .option("fetchOffset.numRetries", "12").option("fetchOffset.retryIntervalMs", "200").load()
         .writeStream.foreachBatch(lambda df, b: seen.update(r.key for r in df.collect()))
         .option("checkpointLocation", str(tmp_path / "ck")).trigger(processingTime="200 milliseconds").start())
    try:
        q.processAllAvailable()
        assert len(seen) == 100
        srv.stop()
        # down for several trigger intervals: poll until the query has tried (and kept trying)
        down_polls = 0
        deadline = time.monotonic() + 60
        while down_polls < 10 and time.monotonic() < deadline:
            assert q.exception() is None and q.isActive
            down_polls += 1
            time.sleep(0.1)
        srv2 = upr_server(partitions=4, data_dir=srv.data_dir, args=["--port", str(port)])
        assert srv2.url == srv.url
        bulk(srv.url, [{"op": "set", "key": f"b{i}", "value": 1} for i in range(100)], durability="persist")
        q.processAllAvailable()
    finally:
        q.stop()
    assert q.exception() is None
    assert seen == {f"a{i}" for i in range(100)} | {f"b{i}" for i in range(100)}
