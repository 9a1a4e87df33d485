"""upr's storage engine.

The folders are the layers (import-linter checks the direction, by folder):

* ``engine/core/``      pure core shared with clients: types, errors, keys and the partition
                        hash, the rollback rule, the failover log and its policy
* ``engine/protocol/``  pure stream protocol: messages, frames, sessions, barriers, flow control
* ``engine/storage/``   the on-disk half (LMDB): record layout, block format, compaction,
                        data-dir lock, ``Store``
* ``engine/*.py``       the engine built on them: ``writequeue`` (the in-memory half,
                        pyrsistent), ``batch_writer`` (memory <- clients), ``flusher``
                        (memory -> disk), ``snapshot`` (disk + memory views), ``partition``,
                        ``config`` and the ``engine.Engine`` facade

This package's ``__init__`` deliberately imports nothing: clients import the pure
subpackages (``engine.core`` and ``engine.protocol``) without pulling in LMDB or pyrsistent.
"""
