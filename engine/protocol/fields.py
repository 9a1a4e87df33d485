"""Field kinds: the one description of a message field that decodes, encodes and documents it.

Every field of a control message names a ``Kind``.  The kind

* validates and converts the field when decoding (``Kind.load``: wrong type or range ->
  ``ProtocolError`` with code ``invalid_field`` and the field's dotted name),
* renders it when encoding (``Kind.dump``),
* and describes it as JSON Schema (``Kind.schema``) for ``openapi/asyncapi.yaml``.

Keeping the three in one object is what stops the decoder, the encoder and the published schema
from drifting apart.  ``load_fields`` applies a set of kinds to a JSON object (unknown fields are
refused: a typo must not silently change what a consumer gets).
"""
from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any

from engine.core.types import MAX_SEQNO, FailoverEntry
from engine.protocol.errors import ErrorCode, ProtocolError
from engine.protocol.limits import MAX_FAILOVER_ENTRIES, MAX_PARTITION_ID, MAX_PARTITIONS_LIST
from engine.protocol.schema import object_schema

__all__ = [
    "PARTITION",
    "U64",
    "Bool",
    "Enum",
    "FailoverLogKind",
    "Int",
    "Kind",
    "Nullable",
    "PartitionList",
    "PartitionMap",
    "Record",
    "Str",
    "invalid_field",
    "json_type",
    "load_fields",
]


def invalid_field(field: str, message: str) -> ProtocolError:
    """The error for a field that is present but wrong, naming the field."""
    return ProtocolError(ErrorCode.INVALID_FIELD, f"{field}: {message}", field=field)


def json_type(value: Any) -> str:
    """The JSON name of a parsed value's type, for error messages a non-Python peer understands."""
    return {
        bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


class Kind:
    """How one field is checked, rendered and documented."""

    description: str = ""

    def load(self, value: Any, field: str) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    def dump(self, value: Any) -> Any:
        return value

    def schema(self) -> dict[str, Any]:  # pragma: no cover - abstract
        raise NotImplementedError


class Int(Kind):
    def __init__(self, lo: int, hi: int, description: str = "") -> None:
        self.lo, self.hi, self.description = lo, hi, description

    def load(self, value: Any, field: str) -> int:
        if type(value) is not int:  # bool is an int subclass; refuse it and floats alike
            raise invalid_field(field, f"expected an integer, got {json_type(value)}")
        if not self.lo <= value <= self.hi:
            raise invalid_field(field, f"{value} is outside {self.lo}..{self.hi}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.lo, "maximum": self.hi}


class Bool(Kind):
    def __init__(self, description: str = "") -> None:
        self.description = description

    def load(self, value: Any, field: str) -> bool:
        if type(value) is not bool:
            raise invalid_field(field, f"expected a boolean, got {json_type(value)}")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


class Str(Kind):
    def __init__(self, min_len: int, max_len: int, description: str = "") -> None:
        self.min_len, self.max_len, self.description = min_len, max_len, description

    def load(self, value: Any, field: str) -> str:
        if type(value) is not str:
            raise invalid_field(field, f"expected a string, got {json_type(value)}")
        if not self.min_len <= len(value) <= self.max_len:
            raise invalid_field(field, f"length {len(value)} is outside {self.min_len}..{self.max_len} characters")
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "minLength": self.min_len, "maxLength": self.max_len}


class Enum(Kind):
    """The text of an enum member, decoded to the member: any member of ``values`` (an enum), or
    only the listed members (a field that allows part of an enum).  The enum itself is the one
    list of allowed values, so the decoder and the schema cannot drift from it."""

    def __init__(self, values: type[enum.Enum] | tuple[enum.Enum, ...], description: str = "") -> None:
        members = tuple(values)
        assert members and len({type(m) for m in members}) == 1, values
        self.enum_type: type[enum.Enum] = type(members[0])
        self.values: tuple[str, ...] = tuple(m.value for m in members)
        self.description = description

    def load(self, value: Any, field: str) -> Any:
        if type(value) is not str or value not in self.values:
            raise invalid_field(field, f"expected one of {', '.join(self.values)}, got {value!r}"[:300])
        return self.enum_type(value)

    def dump(self, value: Any) -> Any:
        return value.value if isinstance(value, enum.Enum) else value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


class Nullable(Kind):
    def __init__(self, inner: Kind, description: str = "") -> None:
        self.inner, self.description = inner, description or inner.description

    def load(self, value: Any, field: str) -> Any:
        return None if value is None else self.inner.load(value, field)

    def dump(self, value: Any) -> Any:
        return None if value is None else self.inner.dump(value)

    def schema(self) -> dict[str, Any]:
        return {"oneOf": [self.inner.schema(), {"type": "null"}]}


class PartitionList(Kind):
    """A list of distinct partition ids (kept as a sorted tuple)."""

    def __init__(self, description: str = "") -> None:
        self.description = description

    def load(self, value: Any, field: str) -> tuple[int, ...]:
        if type(value) is not list:
            raise invalid_field(field, f"expected a list of partition ids, got {json_type(value)}")
        if len(value) > MAX_PARTITIONS_LIST:
            raise invalid_field(field, f"{len(value)} partitions; at most {MAX_PARTITIONS_LIST}")
        item = Int(0, MAX_PARTITION_ID)
        ids = [item.load(v, f"{field}[{i}]") for i, v in enumerate(value)]
        if len(set(ids)) != len(ids):
            raise invalid_field(field, "partition ids must be distinct")
        return tuple(sorted(ids))

    def dump(self, value: Any) -> Any:
        return list(value)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "maxItems": MAX_PARTITIONS_LIST,
            "uniqueItems": True,
            "items": {"type": "integer", "minimum": 0, "maximum": MAX_PARTITION_ID},
        }


class FailoverLogKind(Kind):
    """``[[uuid, seqno], ...]`` newest first, as ``tuple[FailoverEntry, ...]``."""

    def __init__(self, description: str = "") -> None:
        self.description = description

    def load(self, value: Any, field: str) -> tuple[FailoverEntry, ...]:
        if type(value) is not list or len(value) > MAX_FAILOVER_ENTRIES:
            raise invalid_field(field, f"expected a list of at most {MAX_FAILOVER_ENTRIES} [uuid, seqno] pairs")
        out = []
        u64 = Int(0, MAX_SEQNO)
        for i, pair in enumerate(value):
            if type(pair) is not list or len(pair) != 2:
                raise invalid_field(f"{field}[{i}]", "expected a [uuid, seqno] pair")
            out.append(FailoverEntry(u64.load(pair[0], f"{field}[{i}][0]"), u64.load(pair[1], f"{field}[{i}][1]")))
        return tuple(out)

    def dump(self, value: Any) -> Any:
        return [[e.uuid, e.seqno] for e in value]

    def schema(self) -> dict[str, Any]:
        u64 = {"type": "integer", "minimum": 0, "maximum": MAX_SEQNO}
        return {
            "type": "array",
            "maxItems": MAX_FAILOVER_ENTRIES,
            "items": {"type": "array", "minItems": 2, "maxItems": 2, "prefixItems": [u64, u64]},
        }


class PartitionMap(Kind):
    """A JSON object keyed by decimal partition id (JSON keys are strings), as ``dict[int, V]``."""

    def __init__(self, value: Kind, description: str = "") -> None:
        self.value, self.description = value, description

    def load(self, value: Any, field: str) -> dict[int, Any]:
        if type(value) is not dict:
            raise invalid_field(field, f"expected an object keyed by partition id, got {json_type(value)}")
        if len(value) > MAX_PARTITIONS_LIST:
            raise invalid_field(field, f"more than {MAX_PARTITIONS_LIST} partitions")
        out: dict[int, Any] = {}
        for key, item in value.items():
            if not (key.isdigit() and key.isascii()) or int(key) > MAX_PARTITION_ID:
                raise invalid_field(f"{field}.{key}"[:100], "keys must be partition ids 0..65535")
            out[int(key)] = self.value.load(item, f"{field}.{key}")
        return out

    def dump(self, value: Any) -> Any:
        return {str(k): self.value.dump(v) for k, v in value.items()}

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "propertyNames": {"pattern": "^[0-9]{1,5}$"},
            "additionalProperties": self.value.schema(),
        }


class Record(Kind):
    """A nested JSON object whose fields are all required, loaded as ``cls(**fields)``."""

    def __init__(self, cls: type, fields: Mapping[str, Kind], description: str = "") -> None:
        self.cls, self.fields, self.description = cls, dict(fields), description

    def load(self, value: Any, field: str) -> Any:
        if type(value) is not dict:
            raise invalid_field(field, f"expected an object, got {json_type(value)}")
        return self.cls(**load_fields(self.fields, value, field + ".", frozenset()))

    def dump(self, value: Any) -> Any:
        return {name: kind.dump(getattr(value, name)) for name, kind in self.fields.items()}

    def schema(self) -> dict[str, Any]:
        return object_schema(self.fields, required=list(self.fields))


U64 = Int(0, MAX_SEQNO)
PARTITION = Int(0, MAX_PARTITION_ID, "partition id")


def load_fields(
    kinds: Mapping[str, Kind],
    obj: Mapping[str, Any],
    prefix: str,
    optional: frozenset[str],
    skip: tuple[str, ...] = (),
) -> dict[str, Any]:
    """Load every field of ``obj`` with its kind; refuse unknown fields and missing required ones.

    ``prefix`` is the dotted path of ``obj`` within its message, so errors name nested fields
    exactly; ``skip`` names keys that are not fields (a message's ``type``).
    """
    for key in obj:
        if key not in kinds and key not in skip:
            raise ProtocolError(
                ErrorCode.UNKNOWN_FIELD, f"unknown field {prefix}{key[:64]!r}", field=f"{prefix}{key[:64]}"
            )
    out: dict[str, Any] = {}
    for name, kind in kinds.items():
        if name in obj:
            out[name] = kind.load(obj[name], prefix + name)
        elif name not in optional:
            raise ProtocolError(ErrorCode.MISSING_FIELD, f"missing field {prefix}{name!r}", field=prefix + name)
    return out
