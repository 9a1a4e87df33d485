"""What every ``upr`` client command shares: partition lists as arguments, and typed errors as exit statuses.

Its own module so that the command modules (``clients.cli``, ``clients.backup.cli``) depend on it
and not on each other: the top-level client CLI registers the backup commands, so the backup CLI
must not import the top-level one back.

Exit statuses: 0 ok, 1 error (including "not found"), 2 bad arguments, 3 server unreachable,
4 bad or insufficient token.
"""
from __future__ import annotations

import argparse

from engine.core.errors import UprError

from .errors import AuthFailed, ConnectionFailed, UsageError

__all__ = ["EXIT_OK", "EXIT_ERROR", "EXIT_USAGE", "EXIT_UNREACHABLE", "EXIT_AUTH", "exit_code", "parse_partitions"]

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_UNREACHABLE, EXIT_AUTH = 0, 1, 2, 3, 4

#: Typed error -> exit status, most specific first.
_EXIT_CODES: tuple[tuple[type[UprError], int], ...] = (
    (ConnectionFailed, EXIT_UNREACHABLE), (AuthFailed, EXIT_AUTH), (UsageError, EXIT_USAGE), (UprError, EXIT_ERROR),
)


def exit_code(exc: UprError) -> int:
    """The exit status for a typed error: 3 unreachable, 4 bad token, 2 misuse, 1 anything else."""
    return next(code for cls, code in _EXIT_CODES if isinstance(exc, cls))


def parse_partitions(text: str) -> list[int]:
    """``"0,3,5-7"`` -> [0, 3, 5, 6, 7]."""
    out: set[int] = set()
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                if lo > hi or lo < 0:
                    raise ValueError
                out.update(range(lo, hi + 1))
            else:
                n = int(part)
                if n < 0:
                    raise ValueError
                out.add(n)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad partition list {text!r}: use ids and ranges like 0,3,5-7") from None
    if not out:
        raise argparse.ArgumentTypeError("empty partition list")
    return sorted(out)
