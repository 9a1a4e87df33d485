"""The on-disk half of the engine: one LMDB environment holding every partition.

Map (one concept per file):

* ``records``       the databases of the environment and their record formats (by-key record,
                    seqno keys, the per-partition meta records)
* ``blocks``        the block format of the by-seqno tree: a run of items as columns
* ``stale_marks``   the reader of the stale-mark tree (block entries superseded by a rewrite)
* ``compaction``    when and how a partition's blocks are rewritten without stale entries
* ``datadir_lock``  the ``flock`` that keeps a second engine off a data dir
* ``store``         ``Store``: open/close, the write-transaction discipline, meta and flushes
* ``errors``        the start-up and corruption errors the storage layer adds

Above it sit the write queue (memory), the flusher and batch writer (the two paths between
memory and disk) and the ``Engine`` facade.  Nothing here imports them.
"""
