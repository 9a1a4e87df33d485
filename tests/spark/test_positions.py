"""The Spark source's positions are the client's one position type: a ``PartitionOffset`` is a
``StreamOffset`` (uuid, seqno, snapshot start, snapshot end) plus the rollback generation, and a
work item's stream position is one too; checkpointed offsets keep their JSON shape."""
from __future__ import annotations

import json

import pytest

from engine.protocol.client.offset import StreamOffset
from engine.protocol.client.session import ClientSession
from spark_connector.offsets import OffsetFormatError, PartitionOffset, SourceOffset
from spark_connector.planning import WorkItem


def test_a_partition_offset_is_a_stream_offset_with_the_same_invariant():
    off = PartitionOffset(7, 12, 10, 15, 2)
    assert isinstance(off, StreamOffset) and not off.complete
    assert (off.uuid, off.seqno, off.snap_start, off.snap_end, off.generation) == (7, 12, 10, 15, 2)
    with pytest.raises(OffsetFormatError):
        PartitionOffset(7, 20, 10, 15)     # seqno outside its snapshot: DCP's ERANGE


CHECKPOINTS = [
    # what Spark stored in <checkpoint>/offsets/<batch> before (it must still load, unchanged)
    '{"v":1,"np":2,"p":{"0":{"u":"18446744073709551611","s":10,"ss":8,"se":12,"g":3},"1":{"u":"1","s":4,"ss":4,'
    '"se":4,"g":0,"r":0}}}',
    '{"v":1,"np":1,"p":{"0":{"uuid":5,"seqno":9}}}',      # long names, no snapshot range: at its end
]


@pytest.mark.parametrize("raw", CHECKPOINTS)
def test_checkpointed_offsets_still_load_and_keep_their_json(raw):
    off = SourceOffset.from_json(json.loads(raw))
    assert SourceOffset.from_json(off.to_json()) == off
    first = off.partitions[0]
    assert isinstance(first, StreamOffset) and first.snap_start <= first.seqno <= first.snap_end
    if '"u"' in raw:
        assert off.to_json() == json.loads(raw)


def test_a_work_item_resumes_from_its_planned_position_through_the_shared_session():
    w = WorkItem(0, 7, 12, 10, 15, 40)
    session = ClientSession(partitions=[0], offsets={0: w.position}, end_seqnos={0: w.end}, on_rollback="reset")
    from engine.core.types import FailoverEntry
    from engine.protocol.messages import PartitionInfo, StreamRequest

    requests = session.handshake("n", 1, {0: PartitionInfo("active", 50, 0, (FailoverEntry(7, 0),))})
    assert requests == [StreamRequest(0, 7, 12, 10, 15, end_seqno=40)]
