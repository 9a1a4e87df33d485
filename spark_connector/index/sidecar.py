"""A run's lookup sidecar: its rows sorted for point lookups, in text the stdlib reads.

A ``upr index query`` in a new process spends most of its CPU importing pyarrow and scanning
whole Parquet columns (docs/benchmarks.md, Spark: index point lookups).  Next to the Parquet files
of a local run, the job writes ``_lookup.v1``: the same rows in two sorted sections, one per
question a lookup asks, each cut into blocks of ``BLOCK`` lines whose first sort keys and byte
offsets sit in a JSON header line:

* ``values``: ``value TAB key TAB partition TAB seqno`` for every entry, by value: the rows
  whose value equals the one asked are a few consecutive blocks;
* ``keys``: ``key TAB partition`` for every row (entries and markers), by key: does a later run
  hold this candidate key (and so supersede its row)?  Only the blocks that can hold the
  candidates are read.  The first run of a generation is never a later run: none there.

So a lookup reads the header, bisects it, and reads the blocks it needs with plain file I/O.  TAB,
newline and backslash inside values and keys are escaped (``\\t``, ``\\n``, ``\\\\``); both sides
compare escaped strings, whose order is the one the writer sorted by (bytes of UTF-8, which is
code point order, as Python compares ``str``).  The writer builds every line with pyarrow's
vectorised kernels: no per-row Python, so a run of 1e6 rows costs a fraction of its Spark write.

The sidecar is derived from the run's Parquet files after they are complete and before the
manifest names the run (``seal_run``), like the run itself: a sidecar is complete and referenced
by a committed manifest (``Run.sidecar``), or ignored.  Remote indexes have none: the stdlib
cannot read ``s3://``; their lookups go through pyarrow.
"""
from __future__ import annotations

import json
import os
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator

from .errors import IndexError_
from .runs import Run
from .storage import Location

TYPE_CHECKING = False   # typing only for the checkers: `upr index query` imports this module (docs/benchmarks.md)
if TYPE_CHECKING:
    from typing import Any

__all__ = ["BLOCK", "SIDECAR", "CandidateKeys", "Sidecar", "seal_run", "write_sidecar"]

#: Spark's file readers skip names starting with "_" (or "."): the run directory stays a Parquet dataset
SIDECAR = "_lookup.v1"
FORMAT = 1
#: Lines per block: a lookup reads whole blocks, the header holds one entry per block.
BLOCK = 256

_ESCAPES = (("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"))
_UNESCAPE = {"\\": "\\", "t": "\t", "n": "\n"}


def escape(text: str) -> str:
    if "\\" not in text and "\t" not in text and "\n" not in text:
        return text
    for raw, escaped in _ESCAPES:
        text = text.replace(raw, escaped)
    return text


class CandidateKeys:
    """The keys a lookup asks later runs about (``Sidecar.holders``), escaped once for all runs:
    as a set, and in order to find the blocks that can hold them."""

    __slots__ = ("members", "ordered")

    def __init__(self, keys: Iterable[str]) -> None:
        keys = list(keys)
        joined = "".join(keys)      # one scan instead of a Python call per key, in the common case
        needs = "\\" in joined or "\t" in joined or "\n" in joined
        self.members: set[str] = {escape(k) for k in keys} if needs else set(keys)
        self.ordered: list[str] = sorted(self.members)


def unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out, chars = [], iter(text)
    for c in chars:
        out.append(_UNESCAPE.get(next(chars, ""), "") if c == "\\" else c)
    return "".join(out)


# ---------------------------------------------------------------------------------------- writing
def _escaped(column: Any) -> Any:
    import pyarrow.compute as pc
    for raw, escaped in _ESCAPES:
        column = pc.replace_substring(column, raw, escaped)
    return column


def _order(column: Any) -> Any:
    """Indices that sort ``column`` (strings).  Through its dictionary: an indexed field has far
    fewer distinct values than rows, and sorting the distinct ones plus an integer sort costs a
    fraction of a string sort of every row (a value's rows need no order among themselves)."""
    import pyarrow.compute as pc
    encoded = pc.dictionary_encode(column.combine_chunks() if hasattr(column, "combine_chunks") else column)
    rank = pc.rank(encoded.dictionary, sort_keys="ascending")
    return pc.sort_indices(pc.take(rank, encoded.indices))


def _section(table: Any, first: str) -> tuple[bytes, dict[str, Any]]:
    """The rows of ``table`` (string columns, already sorted) as TAB-separated lines, and the
    section's header: ``firsts`` (column ``first`` of every ``BLOCK``-th line) and ``starts``
    (their byte offsets)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    if n == 0:
        return b"", {"size": 0, "firsts": [], "starts": []}
    lines = pc.binary_join_element_wise(*[table[c] for c in table.column_names], "\t")
    lines = pc.binary_join_element_wise(lines, pa.scalar(""), "\n")        # each line ends in "\n"
    arr = pa.concat_arrays([c.cast(pa.large_string()) for c in lines.chunks])
    offsets = pa.Array.from_buffers(pa.int64(), n + 1, [None, arr.buffers()[1]], offset=arr.offset)
    begin, end = offsets[0].as_py(), offsets[n].as_py()
    data = arr.buffers()[2].to_pybytes()[begin:end]
    picks = pa.array(range(0, n, BLOCK), pa.int64())
    starts = pc.subtract(offsets.take(picks), begin).to_pylist()
    firsts = table[first].take(picks).to_pylist()
    return data, {"size": len(data), "firsts": firsts, "starts": starts}


def write_sidecar(where: Location, rel: str, table: Any, keys: bool = True) -> None:
    """Write ``rel``/``SIDECAR`` for ``table`` (the run's rows, ``ENTRY_ARROW_FIELDS``); without
    the ``keys`` section when ``keys`` is false (see ``seal_run``).

    Built in a temporary file of the run directory, fsynced, then moved to its name: a crash
    leaves no half-written sidecar under the name (the manifest, written later, is the commit)."""
    import pyarrow as pa

    key = _escaped(table["key"])
    part = table["partition"].cast(pa.string())
    rows = pa.table({"value": table["value"], "key": key, "partition": part,
                     "seqno": table["seqno"].cast(pa.string())})
    entries = rows.filter(rows["value"].is_valid())
    entries = entries.set_column(0, "value", _escaped(entries["value"]))
    entries = entries.take(_order(entries["value"]))
    values_data, values_head = _section(entries, "value")
    keys_data, keys_head = b"", None
    if keys:
        keys_data, keys_head = _section(pa.table({"key": key, "partition": part}).sort_by([("key", "ascending")]),
                                        "key")
    header = {"format": FORMAT, "block": BLOCK, "values": {"at": 0, **values_head},
              "keys": {"at": len(values_data), **keys_head} if keys_head else None}

    import contextlib
    import tempfile     # here, not at the top: a lookup process never writes, and tempfile is heavy

    final = where.path(f"{rel}/{SIDECAR}")
    fd, tmp = tempfile.mkstemp(prefix=".lookup-", suffix=".tmp", dir=os.path.dirname(final))
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(json.dumps(header, separators=(",", ":")).encode() + b"\n")
            out.write(values_data)
            out.write(keys_data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, final)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def seal_run(where: Location, rel: str, resets: tuple[int, ...] = (), first: bool = False) -> Run:
    """The manifest entry of the complete run at ``rel``: its row count (from the Parquet files)
    and, for a local index, its lookup sidecar, written now.

    ``first``: the run is the first of its generation (a one-batch full build, a full
    compaction).  A first run stays first (later runs are appended; compaction keeps the first
    or replaces everything), and a lookup asks only later runs whether they hold a key, so its
    sidecar has no ``keys`` section: sorting every key of the largest run would cost about as
    much as everything else in it."""
    if not where.is_local:
        from .runfiles import parquet_rows
        return Run(rel, tuple(resets), parquet_rows(where, rel))
    from .runfiles import read_run
    table = read_run(where, rel)
    write_sidecar(where, rel, table, keys=not first)
    return Run(rel, tuple(resets), table.num_rows, SIDECAR)


# ---------------------------------------------------------------------------------------- reading
class Sidecar:
    """One run's sidecar, opened for reading (stdlib only); close it after use."""

    def __init__(self, path: str) -> None:
        self._fh = open(path, "rb")
        try:
            header = json.loads(self._fh.readline())
            if header.get("format") != FORMAT:
                raise IndexError_(f"{path}: unsupported lookup sidecar format {header.get('format')!r}")
        except ValueError as exc:
            self._fh.close()
            raise IndexError_(f"{path}: corrupt lookup sidecar ({exc})") from None
        except BaseException:
            self._fh.close()
            raise
        self._base = self._fh.tell()
        self._values: dict[str, Any] = header["values"]
        self._keys: dict[str, Any] | None = header["keys"]

    def _text(self, section: dict[str, Any], lo: int, hi: int) -> str:
        """The lines of blocks ``lo`` .. ``hi - 1`` of ``section``, as one text."""
        starts = section["starts"]
        begin = starts[lo]
        end = starts[hi] if hi < len(starts) else section["size"]
        self._fh.seek(self._base + section["at"] + begin)
        return self._fh.read(end - begin).decode()

    def entries(self, value: str) -> tuple[list[str], list[int], list[int]]:
        """The run's rows whose value is ``value``: their keys, partitions and seqnos (columns)."""
        wanted = escape(value)
        firsts = self._values["firsts"]
        hi = bisect_right(firsts, wanted)             # blocks from here on start past the value
        if hi == 0:
            return [], [], []
        text = self._text(self._values, max(0, bisect_left(firsts, wanted) - 1), hi)
        # every field of every line in one list (value, key, partition, seqno, ..., ""): the
        # lines are sorted by value, so the value's rows are one slice of it, found by bisection
        fields = text.replace("\t", "\n").split("\n")
        values = fields[0:-1:4]
        first, last = 4 * bisect_left(values, wanted), 4 * bisect_right(values, wanted)
        keys = fields[first + 1:last:4]
        if "\\" in text:
            keys = [unescape(k) for k in keys]
        return keys, list(map(int, fields[first + 2:last:4])), list(map(int, fields[first + 3:last:4]))

    def holders(self, keys: CandidateKeys) -> list[tuple[str, int]]:
        """``(key, partition)`` of the run's rows (entries or markers) whose key is one of ``keys``."""
        if self._keys is None:
            raise IndexError_(f"{self._fh.name}: the sidecar of a first run has no keys section")
        out = []
        for lo, hi in _spans(_blocks_holding(self._keys["firsts"], keys.ordered)):   # consecutive blocks: one read
            fields = self._text(self._keys, lo, hi).replace("\t", "\n").split("\n")   # key, partition, ..., ""
            partition_of = dict(zip(fields[0:-1:2], fields[1::2]))
            out += [(unescape(key), int(partition_of[key])) for key in keys.members.intersection(partition_of)]
        return out

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "Sidecar":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _blocks_holding(firsts: list[str], ordered: list[str]) -> list[int]:
    """The blocks (ascending) whose key range holds one of the sorted keys ``ordered``: block
    ``i`` holds the keys from ``firsts[i]`` up to, not including, ``firsts[i + 1]``.  Bisects the
    shorter list into the longer: thousands of candidate keys against a run of a few blocks cost
    a few bisections, a few keys against a large run a few too."""
    if len(ordered) <= len(firsts):
        return sorted({b for b in (bisect_right(firsts, k) - 1 for k in ordered) if b >= 0})
    out = []
    for i, first in enumerate(firsts):
        at = bisect_left(ordered, first)
        if at < len(ordered) and (i + 1 == len(firsts) or ordered[at] < firsts[i + 1]):
            out.append(i)
    return out


def _spans(blocks: list[int]) -> Iterator[tuple[int, int]]:
    """Ascending block numbers as ``(lo, hi)`` ranges of consecutive ones."""
    i = 0
    while i < len(blocks):
        j = i
        while j + 1 < len(blocks) and blocks[j + 1] == blocks[j] + 1:
            j += 1
        yield blocks[i], blocks[j] + 1
        i = j + 1
