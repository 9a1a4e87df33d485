"""The 200-byte JSON documents every workload writes.

The layout is fixed-width so that a consumer can read the sequence number and the send time back
with two slices instead of a JSON parse: the measurement must not cost more than the feed it
measures. Keys are ``doc:<10 digits>`` so they spread over every partition of a hashed keyspace.
"""

from __future__ import annotations

import string

DOC_SIZE = 200
_HEAD = b'{"i":"%010d","t":"%019d","k":"doc:%010d","v":"'
_TAIL = b'"}'
_PAD_LEN = DOC_SIZE - len(_HEAD % (0, 0, 0)) - len(_TAIL)
_ALPHABET = (string.ascii_lowercase * 8).encode()
# zero-padded numbers are JSON strings (a JSON number may not have leading zeros)
_I_SLICE = slice(6, 16)
_T_SLICE = slice(23, 42)


def key_of(i: int) -> str:
    return "doc:%010d" % i


def make_doc(i: int, t_ns: int = 0) -> bytes:
    """Document number ``i`` stamped with ``t_ns`` (``time.monotonic_ns()`` when it was sent)."""
    start = i % 26
    return (_HEAD % (i, t_ns, i)) + _ALPHABET[start : start + _PAD_LEN] + _TAIL


def doc_index(doc: bytes | str) -> int:
    return int(doc[_I_SLICE])


def doc_sent_ns(doc: bytes | str) -> int:
    return int(doc[_T_SLICE])


def batch(first: int, count: int, t_ns: int = 0) -> list[tuple[str, bytes]]:
    return [(key_of(i), make_doc(i, t_ns)) for i in range(first, first + count)]
