"""Errors the storage layer adds to ``engine.core.errors``::

    UprError
    ├── DataDirInUse          another engine holds the data dir (start-up only)
    ├── CorruptStore          the by-key and by-seqno trees disagree, or a block does not decode
    └── InvalidInput
        └── IncompatibleDataDir   the data dir holds another storage format (start-up only)

They live here rather than in the core because clients never see them as such: the first two
end ``Engine.open``, and a corrupt store is a server fault, not part of the request contract.
"""
from __future__ import annotations

from engine.core.errors import InvalidInput, UprError


class DataDirInUse(UprError):
    """Raised by ``Engine.open`` only (never by a request): the data dir is held by another engine.

    Lives here rather than in ``engine.core.errors`` because it is a start-up failure, not part of
    the request error contract that the HTTP and stream layers map."""

    code = "data_dir_in_use"


class IncompatibleDataDir(InvalidInput):
    """Raised by ``Engine.open`` only: the data dir was written in another storage format.

    A subclass of ``InvalidInput``, so a caller that handles bad input at open handles it too.
    The engine never converts a data dir in place (a half-converted store would be worse than a
    refused one); restore a backup into a new data dir instead."""

    code = "data_dir_format"


class CorruptStore(UprError):
    """The by-key and by-seqno trees disagree or a block does not decode: the store is damaged."""

    code = "corrupt_store"
