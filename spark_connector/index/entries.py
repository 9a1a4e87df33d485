"""The executor side of an index run: source rows (Arrow batches) into staged index rows.

Runs inside Spark's Python workers (``mapInArrow``), so it imports pyarrow lazily and keeps no
state beyond one task; what the driver needs to know about the batch (items read, control rows
seen) travels back in accumulators instead of a second pass over the data.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from .functions import IndexFunction
from .view import ENTRY_SCHEMA

__all__ = ["STAGED_SCHEMA", "ListParam", "entries_fn"]

#: What the executor side emits per source row: index rows, plus the op (control rows pass
#: through with their partition and seqno) and ``first`` = 1 on the first row of each item, so
#: one cached pass gives the controls and the count of changes read.
STAGED_SCHEMA = ENTRY_SCHEMA + ", op STRING, first INT"


def entries_fn(function: IndexFunction, dedup: bool = False, changes: Any = None,  # type: ignore[no-untyped-def]
                controls: Any = None):
    """The executor side: Arrow batches of source rows -> Arrow batches of index rows.

    ``changes`` and ``controls`` are Spark accumulators: the count of items read and the control
    rows seen (partition, op, seqno), so the batch needs a single Spark job (no cache, no second
    pass to find out what it contained).

    With ``dedup`` each key keeps only the rows of its newest seqno *within the task*: exact when
    every server partition's range is read by one task (the source does not split partitions
    unless ``minPartitions`` asks it to), and it saves the batch a shuffle.
    """
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        schema = pa.schema([("value", pa.string()), ("key", pa.string()), ("partition", pa.int32()),
                            ("seqno", pa.int64()), ("op", pa.string()), ("first", pa.int32())])
        newest: dict[str, int] = {}
        held: list[tuple[Any, ...]] = []

        def emit(rows: list[tuple[Any, ...]]) -> Any:
            cols = list(zip(*rows)) if rows else [[]] * 6
            return pa.RecordBatch.from_arrays([pa.array(list(c), t.type) for c, t in zip(cols, schema)],
                                              schema=schema)

        for batch in batches:
            cols = batch.select(["key", "partition", "seqno", "op", "value"]).to_pydict()
            out: list[tuple[Any, ...]] = []
            for key, p, s, op, v in zip(cols["key"], cols["partition"], cols["seqno"], cols["op"], cols["value"]):
                if key is None:     # control row
                    if controls is not None:
                        controls.add([(p, op, s)])
                    continue
                if changes is not None:
                    changes.add(1)
                entries = function(key, v) if op == "mutation" and v is not None else ()
                if not entries:
                    entries = (None,)
                if dedup and key is not None:
                    if newest.get(key, -1) > s:
                        continue
                    newest[key] = s
                f = 1
                for e in entries:
                    out.append((e, key, p, s, op, f))
                    f = 0
            if dedup:
                held.extend(out)
            elif out:
                yield emit(out)
        if dedup and held:
            yield emit([r for r in held if newest[r[1]] == r[3]])
    return run


class ListParam:
    """Accumulator of lists (control rows are few: one per reset/rolled-back partition)."""

    def zero(self, value: list[Any]) -> list[Any]:
        return []

    def addInPlace(self, a: list[Any], b: list[Any]) -> list[Any]:
        a.extend(b)
        return a
