"""``bench.tail_decompose`` on a made-up run: which writes a collection overlapped, histogram shares."""
from __future__ import annotations

from array import array
from pathlib import Path

from bench.tail_decompose import decompose, gc_logs, histogram

MS = 1_000_000


def test_writes_overlapped_by_a_stall_are_counted_per_process(tmp_path: Path) -> None:
    # 100 writes sent 1 ms apart, each received 1 ms later; write 50's receipt is 40 ms late
    sent = array("q", [i * MS for i in range(100)])
    recv = array("q", [s + MS for s in sent])
    recv[50] += 40 * MS
    base = tmp_path / "upr-tail-2500"
    base.with_suffix(".sent").write_bytes(sent.tobytes())
    base.with_suffix(".recv").write_bytes(recv.tobytes())
    gc_dir = tmp_path / "gc"
    gc_dir.mkdir()
    # the server: one 30 ms collection from 52 ms to 82 ms, which writes 50 to 82 were in flight
    # during (33 of 100, among them the slowest), and one too short to count
    (gc_dir / "7.gc").write_text(f"# python -m app.cli server --port 0\n1 {52 * MS} {30 * MS} {29 * MS} 0 2001\n"
                                 f"0 {10 * MS} {MS // 10} {MS // 10} 0 2001\n")
    out = decompose(base, gc_logs(gc_dir))
    server = out["processes"]["upr server (7)"]
    assert out["writes"] == 100 and out["send_receipt_ms"]["p100"] == 41.0
    assert server["stalls >= 1 ms"] == 1
    assert server["writes overlapped %"] == 33.0 and server["slowest 1 % overlapped %"] == 100.0
    assert server["collections"]["gen1"]["cpu_sum_ms"] == 29.0


def test_histogram_shares_are_cumulative_per_bucket() -> None:
    text = "\n".join([
        'upr_stream_delivery_seconds_bucket{le="0.001"} 1.0',
        'upr_stream_delivery_seconds_bucket{le="0.005"} 3.0',
        'upr_stream_delivery_seconds_bucket{le="+Inf"} 4.0',
    ])
    assert histogram(text, "upr_stream_delivery_seconds") == {"n": 4.0, "<= 1 ms": 25.0, "<= 5 ms": 75.0}
