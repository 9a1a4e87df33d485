"""``upr`` is one command tree: every group hangs off the root parser and answers ``--help``."""
from __future__ import annotations

import argparse

import pytest

from app.cli import build_parser

#: The groups a user finds under ``upr --help``; a new group joins this list.
COMMANDS = ["server", "openapi", "tail", "status", "partitions", "failover-log", "put", "get", "delete",
            "barrier", "backup", "cluster", "index"]


def _commands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_group_is_in_the_one_tree() -> None:
    assert sorted(_commands(build_parser())) == sorted(COMMANDS)


@pytest.mark.parametrize("argv", [[c, "--help"] for c in COMMANDS]
                         + [["backup", a, "--help"] for a in ("create", "info", "verify", "restore", "merge")]
                         + [["index", a, "--help"] for a in ("run", "query", "info")]
                         + [["cluster", "status", "--help"]])
def test_every_command_answers_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: upr " + " ".join(argv[:-1]))
