"""The pure core every layer shares: item and position types, errors, keys, the rollback rule,
the failover-log rules and the policy of when an entry is added.

Standard library only (import-linter checks it), so clients and Spark import it without
pulling in LMDB or pyrsistent.
"""
