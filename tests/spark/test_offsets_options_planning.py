"""Pure parts of the Spark connector: offsets, options, planning, policies (no Spark, no server)."""
from __future__ import annotations

import json

import pytest

from spark_connector.offsets import OffsetFormatError, PartitionOffset, SourceOffset, backlog, stream_start
from spark_connector.options import OnRollback, OptionError, Position, parse_options, parse_partitions
from spark_connector.planning import (
    DEFAULT_TASKS,
    ROWS_PER_TASK,
    WorkItem,
    apply_budget,
    pack,
    plan_tasks,
    split_items,
    work_items,
)
from spark_connector.progress import (
    RollbackNeeded,
    RollbackRequired,
    ServerMeta,
    ServerPartition,
    initial_offset,
    next_offset,
    resolve_positions,
)

S = "http://127.0.0.1:1"


# ------------------------------------------------------------------ offsets

def test_offset_round_trip_through_json_text():
    off = SourceOffset({0: PartitionOffset(2**64 - 5, 10, 8, 12, 3), 7: PartitionOffset(1, 4, 4, 4, 0, 0)}, 8)
    text = json.dumps(off.to_json())
    assert '"u": "18446744073709551611"' in text      # uuids travel as strings
    assert SourceOffset.from_json(json.loads(text)) == off


def test_latest_sentinel_round_trip():
    assert SourceOffset.from_json(SourceOffset.latest().to_json()).latest_sentinel


@pytest.mark.parametrize("raw, fragment", [
    ([], "expected an object"),
    ({"v": 2, "p": {}}, "version"),
    ({"v": 1, "p": []}, "'p' must be"),
    ({"v": 1, "p": {"x": {}}}, "partition id"),
    ({"v": 1, "p": {"0": {"s": 5, "ss": 6, "se": 7}}}, "snapStart <= seqno"),
    ({"v": 1, "p": {"0": {"s": "five"}}}, "seqno"),
    ({"v": 1, "p": {"0": {"s": True}}}, "boolean"),
])
def test_bad_offsets_are_rejected(raw, fragment):
    with pytest.raises(OffsetFormatError, match=fragment):
        SourceOffset.from_json(raw)


@pytest.mark.parametrize("start, end, expect_seqno, expect_control", [
    (PartitionOffset(1, 5, 5, 5), PartitionOffset(1, 9, 9, 9), 5, None),           # normal advance
    (PartitionOffset(1, 5, 5, 5), PartitionOffset(2, 9, 9, 9, 1, 0), 0, "reset"),   # reset: from 0
    (PartitionOffset(1, 5, 5, 5), PartitionOffset(2, 9, 9, 9, 1, 3), 3, "rollback"),  # refetch from R=3
    (None, PartitionOffset(1, 9, 9, 9), 0, None),                                   # new partition
])
def test_stream_start(start, end, expect_seqno, expect_control):
    s = SourceOffset({} if start is None else {0: start}, 1)
    e = SourceOffset({0: end}, 1)
    pos, control = stream_start(s, e, 0)
    assert (pos.seqno, control) == (expect_seqno, expect_control)
    assert backlog(s, e) == {0: 9 - expect_seqno}


# ------------------------------------------------------------------ options

@pytest.mark.parametrize("opts, option, fragment", [
    ({}, "server", "required"),
    ({"server": "ftp://x"}, "server", "http"),
    ({"server": S, "bogus": "1"}, "bogus", "unknown option"),
    ({"server": S, "startingOffsets": "{nope"}, "startingOffsets", "malformed JSON"),
    ({"server": S, "startingOffsets": "[1]"}, "startingOffsets", "non-empty object"),
    ({"server": S, "startingOffsets": '{"0": 5}'}, "startingOffsets", "bare seqno"),
    ({"server": S, "startingOffsets": '{"a": {"seqno": 1}}'}, "startingOffsets", "not an integer"),
    ({"server": S, "startingOffsets": '{"0": {"seqno": 5, "snapStart": 9}}'}, "startingOffsets", "snapStart"),
    ({"server": S, "endingOffsets": "soon"}, "endingOffsets", "malformed JSON"),
    ({"server": S, "maxOffsetsPerTrigger": "0"}, "maxOffsetsPerTrigger", "positive"),
    ({"server": S, "maxOffsetsPerTrigger": "ten"}, "maxOffsetsPerTrigger", "positive"),
    ({"server": S, "minPartitions": "-1"}, "minPartitions", "positive"),
    ({"server": S, "batchBytes": "0"}, "batchBytes", "positive"),
    ({"server": S, "onRollback": "ignore"}, "onRollback", "resetPartition"),
    ({"server": S, "partitions": "3-1"}, "partitions", "end before start"),
    ({"server": S, "partitions": "[1, \"a\"]"}, "partitions", "list of integers"),
    ({"server": S, "partitions": "x"}, "partitions", "bad item"),
])
def test_bad_options_name_the_option(opts, option, fragment):
    with pytest.raises(OptionError, match=fragment) as info:
        parse_options(opts)
    assert info.value.field == option
    assert f"'{option}'" in str(info.value)


def test_options_are_case_insensitive_and_typed():
    o = parse_options({"SERVER": S + "/", "maxoffsetspertrigger": "100", "onrollback": "REFETCH",
                       "startingOffsets": '{"3": {"uuid": "7", "seqno": 5}, "4": -1, "5": {"seqno": -2}}',
                       "partitions": "3-5"})
    assert o.server == S and o.max_offsets_per_trigger == 100 and o.on_rollback is OnRollback.REFETCH
    assert o.starting == {3: PartitionOffset(7, 5, 5, 5), 4: Position.LATEST, 5: Position.EARLIEST}
    assert o.partitions == (3, 4, 5)
    assert parse_options({"server": S, "batchbytes": "1048576"}).batch_bytes == 1048576
    defaults = parse_options({"server": S})
    assert (defaults.starting, defaults.ending, defaults.on_rollback) == (
        Position.EARLIEST, Position.LATEST, OnRollback.RESET_PARTITION)


@pytest.mark.parametrize("text, expect", [
    ("all", None), ("", None), ("0", (0,)), ("0-2,5", (0, 1, 2, 5)), ("[4, 1, 4]", (1, 4)),
])
def test_parse_partitions(text, expect):
    assert parse_partitions(text) == expect


# ------------------------------------------------------------------ planning

def _item(p, start, end, control=None):
    return WorkItem(p, 1, start, start, start, end, control)


@pytest.mark.parametrize("backlogs, budget, expect", [
    ({0: 10, 1: 10}, None, {0: 10, 1: 10}),
    ({0: 10, 1: 10}, 100, {0: 10, 1: 10}),
    ({0: 10, 1: 10}, 10, {0: 5, 1: 5}),
    ({0: 90, 1: 10}, 10, {0: 9, 1: 1}),
    ({0: 1000, 1: 1, 2: 0}, 10, {0: 9, 1: 1, 2: 0}),      # small partitions still advance
    ({0: 7, 1: 7, 2: 7}, 10, {0: 4, 1: 3, 2: 3}),         # remainder to the largest/lowest id
])
def test_apply_budget(backlogs, budget, expect):
    got = apply_budget(backlogs, budget)
    assert got == expect
    if budget is not None:
        assert sum(got.values()) <= max(budget, len([b for b in backlogs.values() if b]))


def test_pack_balances_by_backlog_and_keeps_every_item():
    items = [_item(p, 0, b) for p, b in enumerate([100, 90, 10, 10, 10, 5, 1])]
    groups = pack(items, 3)
    loads = sorted(sum(i.backlog for i in g) for g in groups)
    assert loads == [36, 90, 100]
    assert sorted(i.partition for g in groups for i in g) == list(range(7))
    assert pack([], 4) == [] and len(pack(items[:2], 8)) == 2


def test_split_items_covers_the_range_exactly_once_and_keeps_control_on_first_piece():
    pieces = split_items([_item(0, 0, 1000, "reset"), _item(1, 10, 20)], 8)
    assert len(pieces) >= 8
    for pid, lo, hi in [(0, 0, 1000), (1, 10, 20)]:
        mine = [w for w in pieces if w.partition == pid]
        assert mine[0].start == lo and mine[-1].end == hi
        assert all(a.end == b.start for a, b in zip(mine, mine[1:]))
    assert [w.control for w in pieces if w.partition == 0][:2] == ["reset", None]
    # a piece that starts mid-range resumes on the batch's branch, never with the start's uuid 0
    branchy = split_items([WorkItem(0, 0, 0, 0, 0, 100, None, 77)], 4)
    assert [w.uuid for w in branchy] == [0, 77, 77, 77]
    assert [(w.start, w.end) for w in branchy] == [(0, 25), (25, 50), (50, 75), (75, 100)]


def test_plan_from_offsets_is_deterministic_and_skips_idle_partitions():
    start = SourceOffset({0: PartitionOffset(1, 5, 5, 5), 1: PartitionOffset(1, 3, 3, 3)}, 2)
    end = SourceOffset({0: PartitionOffset(1, 9, 9, 9), 1: PartitionOffset(1, 3, 3, 3)}, 2)
    assert work_items(start, end) == [WorkItem(0, 1, 5, 5, 5, 9, None, 1)]
    assert plan_tasks(start, end, None) == plan_tasks(start, end, None)
    assert plan_tasks(start, start, None) == []
    assert plan_tasks(SourceOffset.latest(), end, None) == []


def test_small_backlogs_are_few_tasks_large_ones_default_tasks_and_min_partitions_wins():
    def offsets(per_partition: int) -> tuple[SourceOffset, SourceOffset]:
        start = SourceOffset({p: PartitionOffset(1, 0, 0, 0) for p in range(16)}, 16)
        end = SourceOffset({p: PartitionOffset(1, per_partition, per_partition, per_partition) for p in range(16)}, 16)
        return start, end

    small = plan_tasks(*offsets(10_000 // 16), None)            # a 1 % incremental change of 1e6 documents
    assert len(small) == 1 and len(small[0]) == 16
    assert len(plan_tasks(*offsets(3 * ROWS_PER_TASK // 16), None)) == 3
    assert len(plan_tasks(*offsets(1_000_000 // 16), None)) == DEFAULT_TASKS
    assert len(plan_tasks(*offsets(10), 4)) == 4                  # minPartitions is honoured as before


# ------------------------------------------------------------------ progress and policies

META = ServerMeta(2, {0: ServerPartition(0, 100, 0, ((9, 50), (1, 0))),
                      1: ServerPartition(1, 40, 0, ((2, 0),))})


def _check_branch_at_50(pos, sp):
    if sp.partition == 0 and pos.seqno > 50:
        return RollbackNeeded(50, "diverged")
    return None


@pytest.mark.parametrize("policy, expect0", [
    # the end is a batch cut: an open snapshot from the restart seqno + 1 (spark_connector.cuts)
    (OnRollback.RESET_PARTITION, PartitionOffset(9, 100, 1, 100, 1, 0, open_snapshot=True)),
    (OnRollback.REFETCH, PartitionOffset(9, 100, 51, 100, 1, 50, open_snapshot=True)),
])
def test_policies_bump_generation_and_mark_restart(policy, expect0):
    start = SourceOffset({0: PartitionOffset(1, 60, 60, 60), 1: PartitionOffset(2, 40, 40, 40)}, 2)
    end = next_offset(start, META, check=_check_branch_at_50, policy=policy)
    assert end.partitions[0] == expect0
    assert end.partitions[1] == start.partitions[1]          # untouched partition unchanged
    items = work_items(start, end)
    assert [(i.partition, i.start, i.end, i.control) for i in items] == [
        (0, expect0.restart_from, 100, "reset" if policy is OnRollback.RESET_PARTITION else "rollback")]


def test_fail_policy_names_partition_and_seqno():
    start = SourceOffset({0: PartitionOffset(1, 60, 60, 60), 1: PartitionOffset(2, 0, 0, 0)}, 2)
    with pytest.raises(RollbackRequired, match="ROLLBACK_REQUIRED partition 0 to seqno 50"):
        next_offset(start, META, check=_check_branch_at_50, policy=OnRollback.FAIL)


def test_next_offset_budget_target_and_idle():
    start = SourceOffset({0: PartitionOffset(), 1: PartitionOffset()}, 2)
    ok = lambda pos, sp: None  # noqa: E731
    end = next_offset(start, META, check=ok, policy=OnRollback.FAIL, max_rows=14)
    assert {p: o.seqno for p, o in end.partitions.items()} == {0: 10, 1: 4}
    assert end.partitions[0].uuid == 9                       # newest branch uuid
    end = next_offset(start, META, check=ok, policy=OnRollback.FAIL, target={0: 30, 1: 40})
    assert {p: o.seqno for p, o in end.partitions.items()} == {0: 30, 1: 40}
    done = SourceOffset({0: PartitionOffset(9, 100, 100, 100), 1: PartitionOffset(2, 40, 40, 40)}, 2)
    assert next_offset(done, META, check=ok, policy=OnRollback.FAIL) == done


def test_initial_offsets_are_deterministic_and_latest_is_a_sentinel():
    assert initial_offset(Position.LATEST, META, [0, 1]).latest_sentinel
    assert initial_offset({0: Position.LATEST}, META, [0, 1]).latest_sentinel
    first = initial_offset(Position.EARLIEST, META, [0, 1])
    assert first == SourceOffset({0: PartitionOffset(), 1: PartitionOffset()}, 2)
    resolved = resolve_positions({0: Position.LATEST}, META, [0, 1])
    assert resolved.partitions == {0: PartitionOffset(9, 100, 100, 100), 1: PartitionOffset()}


def test_unlisted_partitions_get_the_given_default():
    ending = resolve_positions({0: PartitionOffset(9, 30, 30, 30)}, META, [0, 1], unlisted=Position.LATEST)
    assert ending.partitions == {0: PartitionOffset(9, 30, 30, 30), 1: PartitionOffset(2, 40, 40, 40)}
