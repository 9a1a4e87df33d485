"""The rows the ``upr`` source yields, built column-wise as Arrow record batches.

Yielding ``pyarrow.RecordBatch`` from ``read()`` skips Spark's per-row Python-to-Arrow conversion
(1.2-4x faster, ../shared/notes/spark.md §6), and the stream already delivers items as columns.

``op`` is ``mutation`` or ``deletion`` for items, and for control rows:

* ``reset``: the partition is restreamed from 0 in this batch; drop everything you derived from
  it before applying its rows.
* ``rollback``: the partition's history after ``seqno`` was lost on the server; rows you derived
  from seqnos above it must be corrected (re-fetch those keys), then the stream goes on from it.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence

import pyarrow as pa

SCHEMA_DDL = ("partition INT, seqno BIGINT, key STRING, op STRING, value BINARY, cas BIGINT, rev BIGINT, "
              "snap_start BIGINT, snap_end BIGINT")

ARROW_SCHEMA = pa.schema([
    ("partition", pa.int32()),
    ("seqno", pa.int64()),
    ("key", pa.string()),
    ("op", pa.string()),
    ("value", pa.binary()),
    ("cas", pa.int64()),
    ("rev", pa.int64()),
    ("snap_start", pa.int64()),
    ("snap_end", pa.int64()),
])

MUTATION, DELETION, RESET, ROLLBACK = "mutation", "deletion", "reset", "rollback"
_I64 = (1 << 63) - 1


@functools.cache
def ops_array() -> pa.Array:
    """``op`` by the deleted flag (0, 1), for ``take``.  Built on first use, not at import: ``pa.array``
    on a Python list imports pandas (0.2 s), and the driver's streaming-source process, started
    afresh for every query, imports this module without ever building rows."""
    return pa.array([MUTATION, DELETION])


def control_batch(partition: int, op: str, seqno: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_arrays([
        pa.array([partition], pa.int32()), pa.array([seqno], pa.int64()), pa.array([None], pa.string()),
        pa.array([op]), pa.array([None], pa.binary()), pa.array([None], pa.int64()),
        pa.array([None], pa.int64()), pa.array([seqno], pa.int64()), pa.array([seqno], pa.int64()),
    ], schema=ARROW_SCHEMA)


def items_batch(
    partition: int,
    seqnos: Sequence[int],
    cas: Sequence[int],
    revs: Sequence[int],
    deleted: Sequence[int | bool],
    keys: Sequence[str | bytes],
    values: Sequence[bytes],
    snap_start: int,
    snap_end: int,
) -> pa.RecordBatch:
    """One batch of stream items of one partition and snapshot.  CAS values above 2**63-1 are
    folded into BIGINT range (Spark has no unsigned type); they are opaque tokens anyway."""
    n = len(seqnos)
    key_arr = pa.array(keys, pa.binary()).cast(pa.string()) if n and isinstance(keys[0], bytes) \
        else pa.array(keys, pa.string())
    ops = ops_array().take(pa.array([1 if d else 0 for d in deleted], pa.int8()))
    return pa.RecordBatch.from_arrays([
        pa.array([partition] * n, pa.int32()),
        pa.array(seqnos, pa.int64()),
        key_arr,
        ops,
        pa.array(values, pa.binary()),
        pa.array([c - (1 << 64) if c > _I64 else c for c in cas], pa.int64()),
        pa.array(revs, pa.int64()),
        pa.array([snap_start] * n, pa.int64()),
        pa.array([snap_end] * n, pa.int64()),
    ], schema=ARROW_SCHEMA)
