"""The lease clock's verdicts, as a table of what the keep-alives saw and when the deadline is
looked at: a renewed lease holds, a node that was not running stops, an etcd that is away does
not demote a running node."""
import pytest

from engine.cluster.lease_clock import LeaseClock, LeaseVerdict

TTL, SLACK = 2.0, 0.5


def _clock(*events: tuple[str, float]) -> LeaseClock:
    clock = LeaseClock(stall_slack_s=SLACK)
    for kind, at in events:
        if kind == "renewed":
            clock.renewed(at, TTL)
        elif kind == "sent":
            clock.attempt(at)
        elif kind == "unreachable":
            clock.unreachable()
    return clock


@pytest.mark.parametrize(
    ("events", "now", "verdict"),
    [
        ([], 100.0, LeaseVerdict.HOLDS),  # not joined yet: nothing to fence
        ([("renewed", 10.0)], 11.9, LeaseVerdict.HOLDS),
        # the deadline counts from the keep-alive's send time, not its answer
        ([("renewed", 10.0)], 12.0, LeaseVerdict.STALLED),
        # renewed in time: the deadline moves
        ([("renewed", 10.0), ("sent", 10.6), ("renewed", 10.6)], 12.3, LeaseVerdict.HOLDS),
        # paused for seconds: the deadline is noticed late, whatever the keep-alives say
        ([("renewed", 10.0), ("sent", 10.6)], 15.0, LeaseVerdict.STALLED),
        ([("renewed", 10.0), ("sent", 10.6), ("unreachable", 0)], 15.0, LeaseVerdict.STALLED),
        # running, noticed on time, a keep-alive refused: etcd is away, keep serving
        ([("renewed", 10.0), ("sent", 10.6), ("unreachable", 0), ("sent", 11.3)], 12.1, LeaseVerdict.ETCD_AWAY),
        # running, noticed on time, a keep-alive still waiting (a paused etcd): etcd is away
        ([("renewed", 10.0), ("sent", 10.6)], 12.4, LeaseVerdict.ETCD_AWAY),
        # on time but no keep-alive tried since the renewal: the keeper did not run
        ([("renewed", 10.0)], 12.2, LeaseVerdict.STALLED),
        # etcd back and answering: the lease holds again
        ([("renewed", 10.0), ("unreachable", 0), ("sent", 14.0), ("renewed", 14.0)], 15.0, LeaseVerdict.HOLDS),
    ],
    ids=["never-joined", "fresh", "deadline-from-send", "renewed", "paused", "paused-while-refused", "etcd-refuses",
         "etcd-paused", "keeper-idle", "etcd-back"],
)
def test_the_verdict_at_the_deadline(events, now, verdict) -> None:
    assert _clock(*events).verdict(now) is verdict
