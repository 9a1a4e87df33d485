"""The backup package's public names are pinned (httpx's test_exported_members habit), and its CLI
registers the five actions with the documented flags."""
from __future__ import annotations

import argparse

import clients.backup as backup
from clients.backup.cli import register


def test_exported_members() -> None:
    assert sorted(backup.__all__) == backup.__all__
    for name in backup.__all__:
        assert getattr(backup, name) is not None
    assert {"create_backup", "restore", "verify", "merge", "archive_info", "Archive"} <= set(backup.__all__)


def test_cli_registers_backup_actions() -> None:
    parser = argparse.ArgumentParser(prog="upr")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["backup", "restore", "--archive", "a", "--partitions", "0,3-5", "--key-filter", "^u:",
                              "--dry-run", "--run", "2"])
    assert (args.partitions, args.key_filter, args.dry_run, args.run) == ([0, 3, 4, 5], "^u:", True, "2")
    args = parser.parse_args(["backup", "merge", "--archive", "a", "--from", "1", "--to", "3"])
    assert (args.from_run, args.to_run) == ("1", "3")
    for action in ("create", "info", "verify"):
        assert callable(parser.parse_args(["backup", action, "--archive", "a"]).func)


def test_cli_reports_errors_as_one_line(tmp_path, capsys) -> None:
    from clients.backup.cli import main

    assert main(["backup", "info", "--archive", str(tmp_path / "nope")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("upr backup info: error: ") and "is not a backup archive" in err
