"""The ``upr`` entry point: subcommands, plugin registration, and ``upr openapi``."""
from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path

import pytest

from app import cli


def test_openapi_command_writes_the_committed_document(tmp_path: Path) -> None:
    out = tmp_path / "openapi.json"
    assert cli.main(["openapi", "-o", str(out)]) == 0
    assert out.read_text() == (Path(__file__).resolve().parents[2] / "openapi" / "openapi.json").read_text()


def test_server_help_documents_every_setting(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["server", "--help"])
    text = capsys.readouterr().out
    for flag in ("--data-dir", "--host", "--port", "--partitions", "--flush-interval-ms", "--config",
                 "--tokens-file", "--queue-memory-limit-mb", "--max-value-bytes", "--max-bulk-bytes",
                 "--max-bulk-items", "--max-key-bytes"):
        assert flag in text, flag
    assert "(default: 64)" in text and "(default: 127.0.0.1)" in text


def test_plugins_register_and_missing_ones_are_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    plugin = types.ModuleType("fake_upr_plugin")

    def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
        p = sub.add_parser("hello", help="test plugin")
        p.set_defaults(func=lambda args: 7)

    plugin.register = register  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_upr_plugin", plugin)
    monkeypatch.setattr(cli, "PLUGIN_MODULES", ("fake_upr_plugin", "no_such_package.cli"))
    assert cli.main(["hello"]) == 7
