"""Reading a partition's stale marks (the ``x<p>`` tree) alongside its blocks.

A rewrite of a key does not cut the old version out of its block: it marks the old seqno
stale (``records`` layout).  Scans and compaction walk blocks in seqno order and need the marks
of each block's range; reading them forward a window at a time keeps that to one C-level
cursor walk and one ``array`` per window instead of a lookup per item.
"""
from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from itertools import islice

import lmdb

from engine.storage.blocks import BIG_ENDIAN
from engine.storage.records import SEQNO

#: Stale marks read per window by ``StaleMarks``.
MARK_WINDOW = 1 << 14


class StaleMarks:
    """The stale marks of one partition from a seqno on, read forward a window at a time (one
    C-level cursor walk and one ``array`` per window), asked for by ascending block ranges."""

    __slots__ = ("_walk", "_marks", "_pos", "_more")

    def __init__(self, txn: lmdb.Transaction, db: object, start: int) -> None:
        cur = txn.cursor(db)
        self._more = cur.set_range(SEQNO.pack(start))
        self._walk = cur.iternext(keys=True, values=False)
        self._marks = array("Q")
        self._pos = 0

    def between(self, first: int, last: int) -> array:
        """The marks in ``[first, last]`` (ascending calls: never below a previous ``last``)."""
        marks = self._marks
        while self._more and (len(marks) == self._pos or marks[-1] <= last):
            chunk = b"".join(islice(self._walk, MARK_WINDOW))
            if len(chunk) < 8 * MARK_WINDOW:
                self._more = False
            window = array("Q")
            window.frombytes(chunk)
            if not BIG_ENDIAN:
                window.byteswap()  # the keys are big-endian
            marks = self._marks = marks[self._pos :] + window
            self._pos = 0
        lo = bisect_left(marks, first, self._pos)
        hi = bisect_right(marks, last, lo)
        self._pos = hi
        return marks[lo:hi]
