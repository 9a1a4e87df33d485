"""``upr server``'s flags come from the settings model: declared once, every field a flag."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from pydantic import Field
from pydantic_settings import CliSuppress

from app.cli import build_parser
from app.settings import Settings
from app.settings_flags import add_settings_flags, flag_name, has_flag, metavar, value_type

#: Flags scripts, tests and docs already use: each must keep working under its name.
EXISTING_FLAGS = [
    "--config", "--data-dir", "--host", "--port", "--partitions", "--flush-interval-ms",
    "--queue-memory-limit-mb", "--max-key-bytes", "--max-value-bytes", "--max-bulk-bytes",
    "--max-bulk-items", "--tokens-file", "--read-threads", "--stream-max-connections",
    "--stream-max-message-bytes", "--stream-default-window-bytes", "--stream-max-window-bytes",
    "--stream-drop-after-s", "--ws-ping-interval-s", "--ws-ping-timeout-s", "--log-level",
    "--access-log", "--ready-file",
]


def _server_parser() -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["server"]


def _flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {opt: a for a in parser._actions for opt in a.option_strings}


def test_every_field_is_a_flag_except_the_suppressed_secrets() -> None:
    flags = _flags(_server_parser())
    for name, info in Settings.model_fields.items():
        if name in ("tokens", "cluster_token"):
            assert not has_flag(info) and flag_name(name) not in flags  # secrets stay out of `ps`
            continue
        assert flags[flag_name(name)].dest == name
        assert info.description, f"{name} needs a description: it is the flag's help"
        assert info.description in flags[flag_name(name)].help


@pytest.mark.parametrize("flag", EXISTING_FLAGS)
def test_existing_flag_names_keep_working(flag: str) -> None:
    assert flag in _flags(_server_parser())


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--port", "0", "--data-dir", "/tmp/x"], {"port": 0, "data_dir": Path("/tmp/x")}),
        (["--config", "c.toml"], {"config_file": Path("c.toml")}),
        (["--config-file", "c.toml"], {"config_file": Path("c.toml")}),
        (["--flush-interval-ms", "2.5", "--partitions", "8"], {"flush_interval_ms": 2.5, "partitions": 8}),
        (["--access-log"], {"access_log": True}),
        (["--no-access-log"], {"access_log": False}),
        (["--log-level", "warning"], {"log_level": "warning"}),
        ([], {}),  # untyped flags stay absent, so UPR_* and the config file keep their say
    ],
)
def test_flags_parse_to_typed_settings_values(argv: list[str], expected: dict[str, object]) -> None:
    args = vars(build_parser().parse_args(["server", *argv]))
    assert {k: v for k, v in args.items() if k in Settings.model_fields} == expected


def test_a_bad_number_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["server", "--port", "eighty"])
    assert info.value.code == 2
    assert "--port" in capsys.readouterr().err


def test_environment_still_reaches_settings_under_upr_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPR_PARTITIONS", "16")
    monkeypatch.setenv("UPR_STREAM_DROP_AFTER_S", "0.5")
    args = vars(build_parser().parse_args(["server", "--port", "0"]))
    settings = Settings(**{k: v for k, v in args.items() if k in Settings.model_fields})
    assert (settings.partitions, settings.stream_drop_after_s, settings.port) == (16, 0.5, 0)


def test_a_new_field_becomes_a_flag_by_being_declared() -> None:
    class Grown(Settings):
        hello_timeout_s: float = Field(10.0, gt=0, description="close a connection that sends no hello")
        per_token_connections: int = 50
        """most stream connections one token may hold"""
        replica_of: str | None = None
        """leader URL to follow"""
        inline_secret: CliSuppress[str | None] = Field(None, description="never on a command line")

    parser = argparse.ArgumentParser()
    added = add_settings_flags(parser, Grown)
    assert {"hello_timeout_s", "per_token_connections", "replica_of"} <= set(added)
    assert "inline_secret" not in added
    flags = _flags(parser)
    assert flags["--hello-timeout-s"].help == "close a connection that sends no hello (default: 10.0)"
    assert flags["--hello-timeout-s"].metavar == "SECONDS" and flags["--hello-timeout-s"].type is float
    assert flags["--per-token-connections"].help == "most stream connections one token may hold (default: 50)"
    assert flags["--per-token-connections"].type is int
    assert flags["--replica-of"].help == "leader URL to follow (default: None)"
    args = parser.parse_args(["--per-token-connections", "3", "--replica-of", "http://a:1"])
    assert Grown(**vars(args)).per_token_connections == 3


@pytest.mark.parametrize(
    ("annotation", "kind"),
    [(int, int), (float, float), (bool, bool), (str, str), (Path, Path), (Path | None, Path),
     (int | None, int), (int | str, str), (list[int], str)],
)
def test_value_type_of_annotations(annotation: object, kind: type) -> None:
    assert value_type(annotation) is kind


@pytest.mark.parametrize(
    ("name", "kind", "shown"),
    [("max_value_bytes", int, "BYTES"), ("flush_interval_ms", float, "MS"), ("stream_drop_after_s", float, "SECONDS"),
     ("queue_memory_limit_mb", int, "MIB"), ("data_dir", Path, "DIR"), ("ready_file", Path, "FILE"),
     ("config_file", Path, "FILE.toml"), ("host", str, "ADDR"), ("port", int, "PORT"), ("log_level", str, "LEVEL"),
     ("partitions", int, "N"), ("ratio", float, "X"), ("replica_of", str, "REPLICA_OF")],
)
def test_metavar_says_what_a_value_is(name: str, kind: type, shown: str) -> None:
    assert metavar(name, kind) == shown
