"""How big each workload is: fast (the test suite, < 2 minutes for everything) and full (by hand).

Every loop in the suite is bounded twice: by these counts and by ``workload_timeout_s``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Sizes:
    mode: str
    batch: int  # documents per write batch (ingest, backfill preload)
    ingest_n: int
    backfill_n: int
    tail_rates: tuple[int, ...]  # paced writes per second
    tail_seconds: float
    fanout_consumers: int
    fanout_processes: int  # consumers are spread over this many consumer processes
    fanout_rate: int  # writes per second while the consumers tail
    fanout_seconds: float
    lmdb_n: int
    ws_frames: tuple[tuple[int, int], ...]  # (frame bytes, frame count)
    workload_timeout_s: float
    drain_grace_s: float  # how long a consumer may lag behind the writer's end before it is cut

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


FAST = Sizes(
    mode="fast", batch=1000, ingest_n=5_000, backfill_n=10_000, tail_rates=(2_500, 10_000), tail_seconds=1.0,
    fanout_consumers=10, fanout_processes=2, fanout_rate=500, fanout_seconds=1.0, lmdb_n=100_000,
    ws_frames=((1024, 20_000), (65536, 2_000)), workload_timeout_s=45, drain_grace_s=3,
)

FULL = Sizes(
    mode="full", batch=1000, ingest_n=200_000, backfill_n=1_000_000, tail_rates=(2_500, 10_000), tail_seconds=20,
    fanout_consumers=50, fanout_processes=4, fanout_rate=1_000, fanout_seconds=20, lmdb_n=1_000_000,
    ws_frames=((1024, 200_000), (65536, 20_000)), workload_timeout_s=600, drain_grace_s=15,
)
