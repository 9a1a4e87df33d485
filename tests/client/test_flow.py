import pytest

from engine.protocol.client.acks import AckTracker

ROWS = [
    # window, frames processed, acks expected after each
    (1000, [100, 50, 60, 10], [0, 0, 210, 0]),
    (1000, [500], [500]),
    (10, [1, 1], [0, 2]),
]


@pytest.mark.parametrize("window,frames,acks", ROWS)
def test_ack_after_a_fifth_of_the_window(window, frames, acks):
    t = AckTracker(window)
    assert [t.processed(n) for n in frames] == acks


def test_every_byte_is_acked_eventually():
    t = AckTracker(1000)
    total = sum(t.processed(n) for n in [7, 130, 99, 1, 250, 3])
    total += t.flush()
    assert total == 490 == t.acked_total
    t.processed(5)
    t.reset()
    assert t.flush() == 0


@pytest.mark.parametrize("window,ratio", [(0, 0.2), (10, 0), (10, 1.5)])
def test_bad(window, ratio):
    with pytest.raises(ValueError):
        AckTracker(window, ratio)
