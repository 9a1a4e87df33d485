"""The client's direct decoding of snapshot markers and cycle ends agrees with the strict decoder."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.protocol import messages as M
from engine.protocol.client.errors import ProtocolViolation
from engine.protocol.client.incoming import decode_frame
from engine.protocol.errors import ProtocolError

BIG = st.integers(0, 1 << 70)


def _generic(text: str) -> object:
    try:
        return M.decode_server_message(text)
    except ProtocolError:
        return ProtocolViolation


def _client(text: str) -> object:
    try:
        return decode_frame(text)
    except ProtocolViolation:
        return ProtocolViolation


@settings(max_examples=200)
@given(BIG, BIG, BIG, st.sampled_from(["memory", "disk", "tape", "Memory", ""]), BIG)
def test_any_marker_text_decodes_as_the_strict_decoder_decodes_it(p: int, start: int, end: int, source: str,
                                                                   purge: int) -> None:
    text = (f'{{"type":"snapshot","partition":{p},"start":{start},"end":{end},"source":"{source}",'
            f'"purge_seqno":{purge}}}')
    assert _client(text) == _generic(text)


@settings(max_examples=100)
@given(BIG)
def test_any_cycle_text_decodes_as_the_strict_decoder_decodes_it(cycle: int) -> None:
    text = f'{{"type":"cycle_complete","cycle":{cycle}}}'
    assert _client(text) == _generic(text)


@pytest.mark.parametrize("text", [
    '{"type":"snapshot","partition":3,"start":5,"end":6,"source":"memory","purge_seqno":0}',
    '{"type":"snapshot","partition":3,"start":05,"end":6,"source":"memory","purge_seqno":0}',
    '{"type":"snapshot","partition":3,"start":5,"end":6,"source":"memory","purge_seqno":0}\n',
    '{"type":"snapshot","partition":3,"start":5,"end":6,"source":"memory","purge_seqno":0,"x":1}',
    '{"type":"snapshot","partition":3,"start":5,"end":6,"source":"memory"}',
    '{"type":"snapshot", "partition":3,"start":5,"end":6,"source":"memory","purge_seqno":0}',
    '{"type":"snapshot","partition":-3,"start":5,"end":6,"source":"memory","purge_seqno":0}',
    '{"type":"snapshot","partition":3,"start":5.0,"end":6,"source":"memory","purge_seqno":0}',
    '{"type":"cycle_complete","cycle":17}',
    '{"type":"cycle_complete","cycle":true}',
    '{"type":"cycle_complete","cycle":17,"cycle":18}',
    '{"type":"cycle_complete"}',
])
def test_near_misses_take_the_strict_path(text: str) -> None:
    assert _client(text) == _generic(text)


def test_the_servers_own_renderings_decode_to_the_messages() -> None:
    marker = M.SnapshotMarker(7, 10, 12, M.SnapshotSource.DISK, 3)
    assert decode_frame(M.encode(marker)) == marker
    assert decode_frame(M.encode(M.CycleComplete(4))) == M.CycleComplete(4)
