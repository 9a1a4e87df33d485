"""upr's storage engine.

This package's ``__init__`` deliberately imports nothing: clients import the pure
subpackages (``engine.core`` and ``engine.protocol``) without pulling in LMDB or pyrsistent.
The engine proper lives in ``engine.engine.Engine``.
"""
