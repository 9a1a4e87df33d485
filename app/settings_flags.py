"""``upr server``'s flags, derived from the settings model so a setting is declared exactly once.

Every field of ``Settings`` becomes ``--field-name`` with the field's description as its help,
so a new setting is a flag (and a ``UPR_*`` variable, and a TOML key) by being declared.  The
argparse type comes from the annotation, so ``--port abc`` is a usage error (exit 2) before
anything starts; pydantic validates ranges when the settings object is built.  A field annotated
``CliSuppress[...]`` (pydantic-settings' marker) gets no flag: inline secrets belong in the
environment, not in every user's ``ps`` listing.
"""
from __future__ import annotations

import argparse
import types
import typing
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

#: Shorter names a flag also answers to (the derived ``--field-name`` always works too).
FLAG_ALIASES: dict[str, tuple[str, ...]] = {"config_file": ("--config",)}
#: Metavars the name rule below cannot guess.
METAVARS: dict[str, str] = {"config_file": "FILE.toml", "cluster": "etcd://HOST:PORT[,...]", "node": "NAME",
                             "advertise": "URL", "cluster_prefix": "PREFIX"}

#: Name endings that say what a value is, shown as the flag's metavar.
_METAVAR_BY_SUFFIX = (
    ("_bytes", "BYTES"), ("_ms", "MS"), ("_s", "SECONDS"), ("_mb", "MIB"), ("_dir", "DIR"),
    ("_file", "FILE"), ("_level", "LEVEL"), ("host", "ADDR"), ("port", "PORT"),
)
_SCALARS: tuple[type, ...] = (bool, int, float, Path, str)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def has_flag(info: FieldInfo) -> bool:
    return argparse.SUPPRESS not in info.metadata


def value_type(annotation: Any) -> type:
    """The scalar a flag's text converts to: ``Path | None`` is a Path, a Literal is str."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return value_type(inner[0]) if len(inner) == 1 else str
    if typing.get_origin(annotation) is typing.Literal:
        return str
    return annotation if annotation in _SCALARS else str


def metavar(field_name: str, kind: type) -> str:
    if field_name in METAVARS:
        return METAVARS[field_name]
    for suffix, name in _METAVAR_BY_SUFFIX:
        if field_name.endswith(suffix):
            return name
    return {int: "N", float: "X", Path: "PATH"}.get(kind, field_name.upper())


def _default_text(info: FieldInfo) -> str:
    if info.default is False:
        return "off"
    if info.default is True:
        return "on"
    return str(info.default)


def add_settings_flags(parser: argparse.ArgumentParser, settings_cls: type[BaseSettings]) -> list[str]:
    """Add one flag per settings field to ``parser``; returns the field names that got one.

    Flags default to ``argparse.SUPPRESS``, so only what the user typed reaches the settings and
    the lower layers (environment, config file, defaults) keep their say."""
    added = []
    for name, info in settings_cls.model_fields.items():
        if not has_flag(info):
            continue
        kind = value_type(info.annotation)
        description = (info.description or "").strip()
        help_text = f"{description} (default: {_default_text(info)})"
        flags = [*FLAG_ALIASES.get(name, ()), flag_name(name)]
        if kind is bool:
            parser.add_argument(*flags, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                                help=help_text)
        else:
            choices = typing.get_args(info.annotation) if typing.get_origin(info.annotation) is typing.Literal else None
            parser.add_argument(*flags, dest=name, type=kind, choices=choices, metavar=metavar(name, kind),
                                default=argparse.SUPPRESS, help=help_text)
        added.append(name)
    return added
