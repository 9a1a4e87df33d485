"""What a tailing reader pays per WebSocket message to get the documents out, by decoder.

    .venv/bin/python -m bench.bench_reader_decode            # 1, 3 and 20 partitions per bundle

A bundle as a tail pass sends it (per partition a snapshot marker and a one-document batch, then
``cycle_complete``) decoded 20,000 times each way: *full* (``decode_bundle``, the marker through
the strict message decoder, ``decode_binary``: what the peer suite's reader did) and *values*
(``bundle_spans``, markers skipped, ``frames.live_values``: what it does now).  Prints CPU µs per
message and per document.
"""
from __future__ import annotations

import time

from bench.suite.docs import make_doc
from bench.suite.upr import _ROUTINE, _ROUTINE_LEN
from engine.core.types import Item
from engine.protocol import frames
from engine.protocol import messages as m
from engine.protocol.bundle import BUNDLE_MAGIC, PART_BINARY, bundle_spans, decode_bundle, encode_bundle, is_bundle


def full(frame: bytes) -> list[bytes]:
    if is_bundle(frame):
        out: list[bytes] = []
        for part in decode_bundle(frame):
            if isinstance(part, str):
                m.decode_server_message(part)
            else:
                out += full(part)
        return out
    b = frames.decode_binary(frame)
    return [v for v, d in zip(b.values, b.deleted) if not d]


def values(frame: bytes) -> list[bytes]:
    if frame[:4] == BUNDLE_MAGIC:
        out: list[bytes] = []
        view = memoryview(frame)
        for kind, a, b in bundle_spans(frame):
            if kind == PART_BINARY:
                out += frames.live_values(view[a:b])
            elif not frame.startswith(_ROUTINE, a, a + _ROUTINE_LEN):
                m.decode_server_message(frame[a:b].decode())
        return out
    return frames.live_values(frame)


def tail_bundle(partitions: int) -> bytes:
    parts: list[str | bytes] = []
    for p in range(partitions):
        parts.append(f'{{"type":"snapshot","partition":{p},"start":5,"end":5,"source":"memory","purge_seqno":0}}')
        parts.append(frames.encode_binary(p, [Item(b"doc:%010d" % p, 5, 1, 1, False, make_doc(p, 123))], False))
    parts.append('{"type":"cycle_complete","cycle":17}')
    return encode_bundle(parts)


def main() -> None:
    n = 20_000
    for partitions in (1, 3, 20):
        frame = tail_bundle(partitions)
        assert full(frame) == values(frame)
        for name, fn in (("full", full), ("values", values)):
            t0 = time.process_time()
            for _ in range(n):
                fn(frame)
            us = 1e6 * (time.process_time() - t0) / n
            print(f"{partitions:2} documents per message, {name:6}: {us:7.1f} µs per message, "
                  f"{us / partitions:5.1f} µs per document", flush=True)


if __name__ == "__main__":
    main()
