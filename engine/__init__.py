"""upr's storage engine.

This package's ``__init__`` deliberately imports nothing: clients import the pure
modules (``engine.types``, ``engine.errors``, ``engine.keys``, ``engine.rollback``,
``engine.failover``, ``engine.protocol``) without pulling in LMDB or pyrsistent.
The engine proper lives in ``engine.engine.Engine``.
"""
