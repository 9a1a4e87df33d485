"""Peer change feeds measured beside upr: Redis Streams, NATS JetStream, PostgreSQL logical decoding.

Each module holds both halves of one peer: the :class:`~bench.suite.adapter.System` the harness
drives (install, start, reset, writer) and ``open_stream``, the reader the consumer process runs.
"""
