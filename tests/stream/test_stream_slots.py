"""Connection slots: the server's limit and each client's, table-driven (no sockets)."""
from __future__ import annotations

import pytest

from app.stream.slots import ConnectionSlots, SlotRefusal

# (steps, expected results): "+c" acquires for client c, "-c" releases; None = granted
CASES = [
    ("a client may hold its limit", ["+a", "+a"], [None, None]),
    ("one more from that client is refused by the client limit", ["+a", "+a", "+a"],
     [None, None, SlotRefusal("client", 2)]),
    ("another client still gets a slot", ["+a", "+a", "+b"], [None, None, None]),
    ("the server limit applies across clients", ["+a", "+a", "+b", "+c"],
     [None, None, None, SlotRefusal("server", 3)]),
    ("a released slot can be taken again", ["+a", "+a", "-a", "+a"], [None, None, None, None]),
    ("a refusal takes nothing", ["+a", "+a", "+a", "-a", "+b", "+b"],
     [None, None, SlotRefusal("client", 2), None, None, None]),
]


@pytest.mark.parametrize("steps,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_slots(steps: list[str], expected: list[SlotRefusal | None]) -> None:
    slots = ConnectionSlots(max_total=3, max_per_client=2)
    got = []
    for step in steps:
        if step[0] == "+":
            got.append(slots.acquire(step[1:]))
        else:
            slots.release(step[1:])
            got.append(None)
    assert got == expected
    assert slots.total == sum(slots.held(c) for c in "abc") <= 3


def test_releasing_a_slot_never_taken_is_a_bug() -> None:
    slots = ConnectionSlots(max_total=3, max_per_client=2)
    with pytest.raises(RuntimeError):
        slots.release("a")
    with pytest.raises(ValueError):
        ConnectionSlots(max_total=0, max_per_client=1)
