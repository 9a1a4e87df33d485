"""Parsing a text frame's JSON, for every decoder (control messages and ``items`` batches).

One function so that every kind of malformed text fails alike: as ``ProtocolError`` with code
``malformed_json``, never as a bare ``ValueError`` or a ``RecursionError`` from deeply nested
input (which the standard library raises for a few thousand ``[`` and which a peer must not be
able to turn into a crash of its reader).
"""
from __future__ import annotations

import json
from typing import Any

from engine.protocol.errors import ErrorCode, ProtocolError

__all__ = ["parse_json"]

#: How much of the parser's own message an error keeps (it may quote the input).
MAX_DETAIL_CHARS = 300


def parse_json(text: str | bytes) -> Any:
    """The JSON value of ``text``; ``ProtocolError(malformed_json)`` when it is not valid JSON."""
    try:
        return json.loads(text)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, f"malformed JSON: {exc}"[:MAX_DETAIL_CHARS]) from None
    except RecursionError:
        raise ProtocolError(ErrorCode.MALFORMED_JSON, "malformed JSON: nested too deeply") from None
