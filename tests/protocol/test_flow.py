"""Flow control: bytes in flight = sent - acked, never more than one frame past the window."""
from __future__ import annotations

import pytest

from engine.protocol.errors import ProtocolError
from engine.protocol.flow import FlowControl

# (operation, bytes, expected in_flight, expected can_send)
STEPS = [
    ("sent", 600, 600, True),
    ("sent", 399, 999, True),
    ("sent", 1, 1000, False),  # window full: start no new frame
    ("ack", 1, 999, True),
    ("sent", 5000, 5999, False),  # one large frame may overshoot
    ("ack", 5999, 0, True),
    ("ack", 0, 0, True),
]


def test_window_transcript() -> None:
    flow = FlowControl(1000)
    for op, nbytes, in_flight, can_send in STEPS:
        (flow.on_sent if op == "sent" else flow.on_ack)(nbytes)
        assert (flow.in_flight, flow.can_send) == (in_flight, can_send), (op, nbytes)
    assert (flow.sent, flow.acked) == (6000, 6000)


def test_available_is_zero_when_overshot() -> None:
    flow = FlowControl(100)
    flow.on_sent(150)
    assert flow.available == 0
    flow.on_ack(100)
    assert flow.available == 50


@pytest.mark.parametrize("ack", [101, -1])
def test_ack_beyond_in_flight_is_a_protocol_error_naming_bytes(ack: int) -> None:
    flow = FlowControl(1000)
    flow.on_sent(100)
    with pytest.raises(ProtocolError) as info:
        flow.on_ack(ack)
    assert (info.value.code, info.value.field) == ("ack_exceeds_in_flight", "bytes")
    assert flow.in_flight == 100  # unchanged


def test_window_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FlowControl(0)
