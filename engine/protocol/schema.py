"""JSON Schema of objects and messages, assembled from their field kinds.

Each ``Kind`` describes its own field (``Kind.schema``); this module puts those descriptions
together into the object schemas that ``engine.protocol.asyncapi`` publishes, so the document
says exactly what the decoder accepts: every listed field, nothing else, the required ones
required.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.protocol.fields import Kind

__all__ = ["message_schema", "object_schema"]


def object_schema(kinds: Mapping[str, Kind], required: list[str]) -> dict[str, Any]:
    """A closed object (``additionalProperties: false``) with one property per field kind."""
    props: dict[str, Any] = {}
    for name, kind in kinds.items():
        schema = kind.schema()
        if kind.description:
            schema = {"description": kind.description, **schema}
        props[name] = schema
    return {"type": "object", "additionalProperties": False, "required": required, "properties": props}


def message_schema(cls: type) -> dict[str, Any]:
    """JSON Schema of one message type, as used in ``openapi/asyncapi.yaml``."""
    fields = dict(cls.FIELDS)  # type: ignore[attr-defined]
    schema = object_schema(fields, required=["type", *[n for n in fields if n not in cls.OPTIONAL]])  # type: ignore[attr-defined]
    schema["properties"] = {"type": {"type": "string", "const": cls.TYPE}, **schema["properties"]}  # type: ignore[attr-defined]
    return schema
