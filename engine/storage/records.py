"""The databases of the LMDB environment and the record formats outside the blocks.

Layout (named databases; ``N`` partitions fixed when the data dir is created; format "2")::

    meta             format, partitions, node_id, clean marker,
                     state/<p>, persisted/<p> (seqno, live items, max cas), purge/<p>, failover/<p>,
                     snapshot/<p> (a replica's snapshot range at the persisted seqno, last whole end)
    b<p>  by-seqno   first seqno(8, big-endian)  ->  block (``engine.storage.blocks``)
    k<p>  by-key     key  ->  seqno(8, big-endian) + cas(8) + rev(8) + deleted(1)
    x<p>  stale      seqno(8, big-endian)  ->  b""   (a block entry superseded by a newer version)

Seqno keys are big-endian so LMDB's byte order is seqno order.  The by-key record is read by
the batch writer (previous CAS and rev of a key not in the write queue) and replaced by the
flusher; both unpack it with ``META``.
"""
from __future__ import annotations

import struct
from operator import itemgetter

#: The storage format this engine reads and writes.
FORMAT = b"2"
#: seqno, cas, rev, deleted: the by-key record.
META = struct.Struct(">QQQ?")
META_SIZE = META.size
#: A seqno as a key of the by-seqno and stale trees.
SEQNO = struct.Struct(">Q")
#: persisted/<p>: persisted seqno, live items, highest persisted CAS.
PERSISTED = struct.Struct(">QQQ")
#: snapshot/<p>: snapshot start, snapshot end, last complete snapshot end (``engine.core.replica_snapshots``).
SNAPSHOT = struct.Struct(">QQQ")

#: The seqno and deleted flag of a packed by-key record, without unpacking the rest.
seqno_of_record = itemgetter(slice(0, 8))
deleted_of_record = itemgetter(24)


def db_names(partition: int) -> tuple[bytes, bytes, bytes]:
    """Names of partition ``partition``'s by-seqno, by-key and stale databases."""
    return b"b%d" % partition, b"k%d" % partition, b"x%d" % partition


def max_dbs(partitions: int) -> int:
    """Named databases an environment of ``partitions`` partitions needs (three each, plus meta)."""
    return 3 * partitions + 1
