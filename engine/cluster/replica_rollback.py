"""How a replica copy answers "roll back to seqno S": undo what it holds above S, or resync from 0.

The spec's replica rules (notes/cluster.md §1) make a replica roll back "like any client": it is
ahead of the branch its active is on, and must end identical to the active's history at ``S``
before streaming on from there.  A client undoes by re-reading the *active's current document*
of every key it changed above ``S`` (dcp.md §0); that is right for a client, whose sink holds
only the latest version of each key, but it is not the history at ``S``: a key the active changed
again after ``S`` has a current document numbered above ``S``, which a copy truncated at ``S``
cannot hold (its seqno would be above the copy's high seqno, and the stream from ``S`` delivers
that very version again).  The state identical to the active's history at ``S`` is, for each key,
**the version it had at ``S``**, and below ``S`` the copy's history *is* the active's (that is
what the rollback point means).  So a replica restores, for each key it changed above ``S``, its
**own last version at or below ``S``**, with that version's seqno, CAS, rev and deleted flag, and
the stream from ``S`` brings whatever the active changed since.  (kv_engine does the same with
the couchstore header at the rollback point.)

Its own history may no longer hold that version: compaction drops superseded versions, the write
queue drops a version rewritten before it was flushed, and a snapshot the copy received across
``S`` was deduplicated by its active.  Revs tell: a key's rev grows by one per change on the node
that wrote it, so the version found is the one at ``S`` exactly when the key's *first* version
above ``S`` has the next rev (a first version of rev 1 means the key had no record at ``S``, and
then no version may be found).  Any other finding means a version is missing, and the only exact
answer left is a **resync from 0**: the same answer when the undo would be too large
(``MAX_UNDO_ITEMS`` versions above ``S``, as kv_engine resets a vbucket rather than roll back
most of it) or would read too much history looking for old versions (``MAX_SEARCH_ITEMS``).

A copy that restarted uncleanly while it was active got a failover entry at its persisted seqno,
a branch that holds none of its items; it resumes on the branch of its last item
(``resume_uuid``), so its active can name the real rollback point instead of answering "unknown
uuid, roll back to 0".

Pure standard library: the storage side (``engine.replica_undo``) gathers the versions, this
module decides, tests/cluster/test_replica_rollback.py tables the rules.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from engine.core.types import FailoverEntry

__all__ = ["MAX_SEARCH_ITEMS", "MAX_UNDO_ITEMS", "Resync", "Undo", "Version", "plan_undo", "resume_uuid"]

#: more versions than this above the rollback seqno: resync instead (a resync costs about the
#: partition's live items, an undo about the versions above ``S`` plus the history searched)
MAX_UNDO_ITEMS = 100_000
#: versions at or below the rollback seqno read, at most, looking for the keys' earlier versions
MAX_SEARCH_ITEMS = 1_000_000


@dataclass(frozen=True, slots=True)
class Version:
    """One stored version of a key (what a by-key record says about it)."""

    seqno: int
    cas: int
    rev: int
    deleted: bool


@dataclass(frozen=True, slots=True)
class Undo:
    """Cut the history above ``seqno`` and make ``restore[key]`` each key's current version again
    (None: the key had no record at ``seqno``)."""

    seqno: int
    restore: Mapping[bytes, Version | None]
    items_above: int


@dataclass(frozen=True, slots=True)
class Resync:
    """The undo cannot be exact (or is too large): empty the copy and stream it from 0."""

    seqno: int
    reason: str


def plan_undo(seqno: int, first_above: Mapping[bytes, Version], last_at_or_below: Mapping[bytes, Version], *,
              items_above: int, searched_all: bool, max_items: int = MAX_UNDO_ITEMS) -> Undo | Resync:
    """Decide a rollback to ``seqno``.

    ``first_above``: for each key with a version above ``seqno``, its lowest-seqno version there;
    ``last_at_or_below``: for those keys, the highest-seqno version at or below ``seqno`` found in
    the copy's history (stale versions included); ``searched_all``: that search covered the whole
    history below ``seqno`` (it may stop early once every key of rev > 1 was found, but a key
    whose first version above is rev 1 is only known absent after a whole search);
    ``items_above``: every version above ``seqno``, stale ones included."""
    if seqno == 0:
        return Resync(seqno, "the rollback point is seqno 0: nothing of the copy is kept")
    if items_above > max_items:
        return Resync(seqno, f"{items_above} versions above seqno {seqno} exceed the undo limit of {max_items}")
    restore: dict[bytes, Version | None] = {}
    for key, first in first_above.items():
        found = last_at_or_below.get(key)
        if first.rev == 1:
            if found is not None:
                return Resync(seqno, f"key {_show(key)}: version of rev 1 at seqno {first.seqno} follows an older "
                                     f"version at seqno {found.seqno} (a purged tombstone between them)")
            if not searched_all:
                return Resync(seqno, f"key {_show(key)}: that it had no record at seqno {seqno} is unproven "
                                     f"within the {MAX_SEARCH_ITEMS} versions searched")
            restore[key] = None
        elif found is None:
            return Resync(seqno, f"key {_show(key)}: its version at seqno {seqno} (rev {first.rev - 1}) is no longer "
                                 "in this copy's history")
        elif found.rev + 1 != first.rev:
            return Resync(seqno, f"key {_show(key)}: the version found at seqno {found.seqno} has rev {found.rev}, "
                                 f"the next one at seqno {first.seqno} rev {first.rev}: a version between them is "
                                 "missing")
        else:
            restore[key] = found
    return Undo(seqno, restore, items_above)


def resume_uuid(log: Sequence[FailoverEntry], high_seqno: int) -> int:
    """The uuid of the branch holding the copy's last item: the newest entry (newest first)
    below ``high_seqno``, since an entry ``(uuid, s)`` covers the seqnos after ``s``; the newest
    entry when none is below (or the copy holds nothing); 0 for an empty log."""
    if not log:
        return 0
    if high_seqno > 0:
        for entry in log:
            if entry.seqno < high_seqno:
                return entry.uuid
    return log[0].uuid


def _show(key: bytes) -> str:
    text = key.decode("utf-8", "replace")
    return repr(text if len(text) <= 64 else text[:61] + "...")
