"""openapi/asyncapi.yaml stays in sync with the message types.

The document is built from the code (engine.protocol.asyncapi); this test checks the committed YAML
equals it, that every message type has a schema with exactly its fields, and that every example
message (and a real item batch) validates against its schema with a small JSON Schema checker
covering the keywords the document uses.  Regenerate with:
    UPDATE_ASYNCAPI=1 .venv/bin/pytest tests/protocol/test_asyncapi.py
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from engine.protocol.asyncapi import build_document, component_name
from engine.protocol.frames import JSON_FIELDS, encode_json
from engine.protocol.messages import CLIENT_MESSAGES, SERVER_MESSAGES, to_json_obj
from engine.core.types import Item
from tests.protocol.examples import CLIENT_EXAMPLES, SERVER_EXAMPLES

PATH = Path(__file__).resolve().parents[2] / "openapi" / "asyncapi.yaml"
HEADER = "# Generated from engine/protocol (engine.protocol.asyncapi.build_document); do not edit by hand.\n" \
         "# Regenerate: UPDATE_ASYNCAPI=1 .venv/bin/pytest tests/protocol/test_asyncapi.py\n"


class _Dumper(yaml.SafeDumper):
    """Multi-line strings as literal blocks, so the descriptions read like the docstrings they are."""


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def render() -> str:
    return HEADER + yaml.dump(build_document(), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=110)


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    if os.environ.get("UPDATE_ASYNCAPI"):
        PATH.parent.mkdir(exist_ok=True)
        PATH.write_text(render())
    return yaml.safe_load(PATH.read_text())


def test_committed_document_equals_the_one_built_from_the_code(document: dict[str, Any]) -> None:
    assert document == build_document(), "openapi/asyncapi.yaml is stale: regenerate it (see module docstring)"


def test_document_is_asyncapi_3(document: dict[str, Any]) -> None:
    assert document["asyncapi"] == "3.0.0"
    assert document["channels"]["stream"]["address"] == "/stream"
    refs = [m["$ref"] for op in document["operations"].values() for m in op["messages"]]
    for ref in refs:
        name = ref.rsplit("/", 1)[1]
        assert name in document["channels"]["stream"]["messages"]
        assert name in document["components"]["messages"]


@pytest.mark.parametrize("cls", [*CLIENT_MESSAGES.values(), *SERVER_MESSAGES.values()], ids=lambda c: c.__name__)
def test_every_message_type_has_a_schema_with_the_same_fields(document: dict[str, Any], cls: type) -> None:
    payload = document["components"]["messages"][component_name(cls)]["payload"]
    assert set(payload["properties"]) == {"type"} | {f.name for f in fields(cls)}
    assert payload["properties"]["type"]["const"] == cls.TYPE  # type: ignore[attr-defined]
    assert set(payload["required"]) == {"type"} | {
        f.name for f in fields(cls) if f.name not in cls.OPTIONAL  # type: ignore[attr-defined]
    }
    assert payload["additionalProperties"] is False


def test_items_schema_has_the_json_codec_columns(document: dict[str, Any]) -> None:
    payload = document["components"]["messages"]["items"]["payload"]
    assert set(payload["properties"]) == set(JSON_FIELDS)


@pytest.mark.parametrize("msg", CLIENT_EXAMPLES + SERVER_EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_example_validates_against_its_schema(document: dict[str, Any], msg: object) -> None:
    payload = document["components"]["messages"][component_name(type(msg))]["payload"]
    assert validate(json.loads(json.dumps(to_json_obj(msg))), payload) == []


def test_a_real_item_batch_validates_against_the_items_schema(document: dict[str, Any]) -> None:
    text = encode_json(3, [Item(b"k", 1, 2, 3, False, b"\x00v"), Item(b"d", 2, 3, 4, True, b"")], last=True)
    assert validate(json.loads(text), document["components"]["messages"]["items"]["payload"]) == []


@pytest.mark.parametrize(
    ("obj", "problem"),
    [
        ({"type": "hello"}, "missing name"),
        ({"type": "hello", "name": "x", "colour": 1}, "unexpected colour"),
        ({"type": "hello", "name": "x" * 201}, "too long"),
        ({"type": "hello", "name": "x", "codec": "msgpack"}, "not in enum"),
    ],
)
def test_the_checker_rejects_what_the_decoder_rejects(document: dict[str, Any], obj: dict, problem: str) -> None:
    payload = document["components"]["messages"]["hello"]["payload"]
    assert any(problem in p for p in validate(obj, payload))


# ------------------------------------------------------------------ a small JSON Schema checker

_TYPES = {
    "string": lambda v: isinstance(v, str),
    "integer": lambda v: type(v) is int,
    "boolean": lambda v: type(v) is bool,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
    "null": lambda v: v is None,
}


def validate(value: Any, schema: dict[str, Any], path: str = "$") -> list[str]:
    problems: list[str] = []
    if "oneOf" in schema:
        matches = [s for s in schema["oneOf"] if not validate(value, s, path)]
        return [] if len(matches) == 1 else [f"{path}: matches {len(matches)} of oneOf"]
    if "type" in schema and not _TYPES[schema["type"]](value):
        return [f"{path}: not {schema['type']}"]
    if "const" in schema and value != schema["const"]:
        problems.append(f"{path}: not const {schema['const']}")
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: not in enum")
    if "minimum" in schema and value < schema["minimum"]:
        problems.append(f"{path}: below minimum")
    if "maximum" in schema and value > schema["maximum"]:
        problems.append(f"{path}: above maximum")
    if "minLength" in schema and len(value) < schema["minLength"]:
        problems.append(f"{path}: too short")
    if "maxLength" in schema and len(value) > schema["maxLength"]:
        problems.append(f"{path}: too long")
    if isinstance(value, list):
        if "minItems" in schema and len(value) < schema["minItems"]:
            problems.append(f"{path}: too few items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            problems.append(f"{path}: too many items")
        if schema.get("uniqueItems") and len({json.dumps(v) for v in value}) != len(value):
            problems.append(f"{path}: items not unique")
        prefix = schema.get("prefixItems", [])
        for i, item in enumerate(value):
            sub = prefix[i] if i < len(prefix) else schema.get("items")
            if sub is not None:
                problems += validate(item, sub, f"{path}[{i}]")
    if isinstance(value, dict):
        for name in schema.get("required", []):
            if name not in value:
                problems.append(f"{path}: missing {name}")
        props = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for name, item in value.items():
            if "propertyNames" in schema and not re.fullmatch(schema["propertyNames"]["pattern"], name):
                problems.append(f"{path}: bad property name {name}")
            if name in props:
                problems += validate(item, props[name], f"{path}.{name}")
            elif extra is False:
                problems.append(f"{path}: unexpected {name}")
            elif isinstance(extra, dict):
                problems += validate(item, extra, f"{path}.{name}")
    return problems
