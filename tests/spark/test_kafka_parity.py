"""What a Kafka source user expects of option names, offsets and progress."""
from __future__ import annotations

import json

import pytest

from spark_connector.offsets import PartitionOffset, SourceOffset
from spark_connector.options import OnRollback, OptionError, Position, parse_options
from spark_connector.progress import check_same_partitions, format_ids, lag_metrics
from tests.spark.helpers import bulk

S = "http://127.0.0.1:1"


@pytest.mark.parametrize("opts, expect", [
    ({}, OnRollback.RESET_PARTITION),
    ({"failOnDataLoss": "true"}, OnRollback.FAIL),
    ({"failondataloss": "False"}, OnRollback.RESET_PARTITION),
    ({"failOnDataLoss": "true", "onRollback": "fail"}, OnRollback.FAIL),
    ({"failOnDataLoss": "false", "onRollback": "resetPartition"}, OnRollback.RESET_PARTITION),
    ({"onRollback": "refetch"}, OnRollback.REFETCH),
])
def test_fail_on_data_loss_is_the_alias_of_on_rollback(opts, expect):
    assert parse_options({"server": S, **opts}).on_rollback is expect


@pytest.mark.parametrize("opts, fragment", [
    ({"failOnDataLoss": "true", "onRollback": "resetPartition"}, "true means onRollback=fail, but onRollback is "
                                                                 "resetPartition"),
    ({"failOnDataLoss": "false", "onRollback": "refetch"}, "false means onRollback=resetPartition"),
    ({"failOnDataLoss": "maybe"}, "expected true or false"),
])
def test_conflicting_or_bad_fail_on_data_loss_is_refused(opts, fragment):
    with pytest.raises(OptionError, match=f"option 'failOnDataLoss': {fragment}"):
        parse_options({"server": S, **opts})


@pytest.mark.parametrize("name, hint", [
    ("maxoffsetpertrigger", "did you mean 'maxOffsetsPerTrigger'?"),
    ("startingoffset", "did you mean 'startingOffsets'?"),
    ("zzz", "known options:"),
])
def test_unknown_option_is_one_line_with_the_nearest_known_name(name, hint):
    with pytest.raises(OptionError) as info:
        parse_options({"server": S, name: "1"})
    message = str(info.value)
    assert message.startswith(f"option '{name}': unknown option; ") and hint in message and "\n" not in message


def test_the_reported_offset_json_round_trips_as_starting_offsets():
    end = SourceOffset({0: PartitionOffset(2**64 - 5, 40, 26, 40, 2, 0, open_snapshot=True),
                        3: PartitionOffset(9, 7, 7, 7)}, 4)
    progress = {**end.to_json(), "minOffsetsBehindLatest": "0"}      # as lastProgress shows it
    for text in (json.dumps(progress), json.dumps(end.to_json())):
        starting = parse_options({"server": S, "startingOffsets": text}).starting
        assert starting == dict(end.partitions)
    latest = json.dumps(SourceOffset.latest().to_json())
    assert parse_options({"server": S, "startingOffsets": latest}).starting is Position.LATEST


@pytest.mark.parametrize("ids, text", [([0, 1, 2, 3, 7], "0-3,7"), ([5], "5"), ([2, 4, 5, 6, 9, 10], "2,4-6,9-10")])
def test_format_ids(ids, text):
    assert format_ids(ids) == text


def test_a_changed_partitions_option_names_both_values():
    start = SourceOffset({p: PartitionOffset() for p in range(4)}, 16)
    check_same_partitions(start, [0, 1, 2, 3])
    with pytest.raises(OptionError, match="option 'partitions': the checkpoint streams partitions 0-3 but the "
                                          "option now selects 0-5"):
        check_same_partitions(start, list(range(6)))


def test_lag_metrics():
    planned = SourceOffset({0: PartitionOffset(1, 10, 10, 10), 1: PartitionOffset(1, 5, 5, 5)}, 2)
    latest = SourceOffset({0: PartitionOffset(1, 30, 30, 30), 1: PartitionOffset(1, 5, 5, 5)}, 2)
    assert lag_metrics(planned, latest) == {"minOffsetsBehindLatest": "0", "avgOffsetsBehindLatest": "10.0",
                                            "maxOffsetsBehindLatest": "20"}
    assert lag_metrics(None, latest) == {} and lag_metrics(SourceOffset.latest(), latest) == {}


@pytest.mark.slow
def test_progress_offsets_restart_from_json_and_a_changed_partitions_option(spark, upr_server, tmp_path):
    srv = upr_server(partitions=4)
    bulk(srv.url, [{"op": "set", "key": f"a{i}", "value": 1} for i in range(200)])

    def run(ck: str, **options: str) -> tuple[list[str], object]:
        seen: list[str] = []
        reader = spark.readStream.format("upr").option("server", srv.url).option("maxOffsetsPerTrigger", "120")
        q = (reader.options(**options).load()
             .writeStream.foreachBatch(lambda df, b: seen.extend(r.key for r in df.collect()))
             .option("checkpointLocation", str(tmp_path / ck)).trigger(availableNow=True).start())
        try:
            q.awaitTermination(120)
        except Exception:   # noqa: BLE001 -- the caller checks q.exception()
            pass
        return seen, q

    seen, q = run("ck1")
    assert q.exception() is None and sorted(seen) == sorted(f"a{i}" for i in range(200))
    last = [p for p in q.recentProgress if p["numInputRows"]][-1]["sources"][0]
    end = last["endOffset"] if isinstance(last["endOffset"], str) else json.dumps(last["endOffset"])
    latest = json.loads(last["latestOffset"]) if isinstance(last["latestOffset"], str) else last["latestOffset"]
    assert latest["minOffsetsBehindLatest"] == latest["maxOffsetsBehindLatest"] == "0"   # caught up
    first = [p for p in q.recentProgress if p["numInputRows"]][0]["sources"][0]
    lag = json.loads(first["latestOffset"]) if isinstance(first["latestOffset"], str) else first["latestOffset"]
    assert int(lag["maxOffsetsBehindLatest"]) > 0                                       # the first batch was capped

    bulk(srv.url, [{"op": "set", "key": f"b{i}", "value": 1} for i in range(50)])
    again, q = run("ck2", startingOffsets=end)       # the reported offset, as a new query's start
    assert q.exception() is None and sorted(again) == sorted(f"b{i}" for i in range(50))

    _, q = run("ck1", partitions="0-1")
    assert "option 'partitions': the checkpoint streams partitions 0-3 but the option now selects 0-1" \
        in str(q.exception())
