"""The pure core every layer shares: item and position types, errors, keys, the rollback rule
and the failover-log rules.

Standard library only (import-linter checks it), so clients and Spark import it without
pulling in LMDB or pyrsistent.
"""
