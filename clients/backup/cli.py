"""``upr backup create|info|verify|restore|merge``: the command line of the backup client.

Hooked into ``upr`` by calling ``register(subparsers)`` from the top-level CLI.  Exit statuses
follow ``clients.cli_support``: 0 ok, 1 failure (the message names partition, seqno, file or offset; for
verify: problems found), 2 bad arguments, 3 server unreachable, 4 bad or insufficient token.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
from collections.abc import Callable, Iterator
from typing import Any

from clients.cli_support import exit_code, parse_partitions
from engine.core.errors import UprError

__all__ = ["register", "main", "parse_partitions"]


def _regex(text: str) -> str:
    try:
        re.compile(text)
    except re.error as exc:
        raise argparse.ArgumentTypeError(f"bad --key-filter regex {text!r}: {exc}") from None
    return text


def register(subparsers: Any) -> None:
    """Add ``backup`` with its subcommands to an argparse subparsers object."""
    from clients.http import default_server, default_token

    backup = subparsers.add_parser("backup", help="full/incremental backups, restore, verify, merge",
                                   description="Back up a upr keyspace from its change stream into an archive "
                                               "directory, and restore it through the bulk API.")
    sub = backup.add_subparsers(dest="backup_command", metavar="ACTION", required=True)

    def common(p: argparse.ArgumentParser, server: bool = False) -> None:
        p.add_argument("--archive", required=True, metavar="DIR", help="archive directory")
        if server:
            p.add_argument("--server", default=default_server(), metavar="URL[,URL...]",
                           help="server base URL; for a cluster, any of its nodes (each partition is streamed "
                                "from, or restored to, its active node as the map says) "
                                "(default: $UPR_SERVER or http://127.0.0.1:8000)")
            p.add_argument("--token", default=default_token(), help="bearer token (default: $UPR_TOKEN)")
        p.add_argument("--json", action="store_true", help="print the result as JSON")
        p.add_argument("-q", "--quiet", action="store_true", help="no progress bars")

    p = sub.add_parser("create", help="take a backup run (full the first time, then incremental)")
    common(p, server=True)
    p.add_argument("--block-kib", type=int, default=256, help="segment block size before compression (KiB, default 256)")
    p.add_argument("--level", type=int, default=1, choices=range(0, 10), metavar="0-9", help="zlib level (default 1)")
    p.add_argument("--full", action="store_true",
                   help="take every partition from seqno 0 even if earlier runs exist (starts a new chain)")
    p.add_argument("--timeout", type=float, default=60.0,
                   help="seconds without stream progress before giving up (default 60)")
    p.set_defaults(func=_guarded(_cmd_create))

    p = sub.add_parser("info", help="list runs, ranges, counts, sizes, rollbacks")
    common(p)
    p.add_argument("--detail", action="store_true", help="per-partition seqno ranges of every run")
    p.set_defaults(func=_guarded(_cmd_info))

    p = sub.add_parser("verify", help="re-read every segment: checksums and seqno continuity")
    common(p)
    p.set_defaults(func=_guarded(_cmd_verify))

    p = sub.add_parser("restore", help="restore the state as of a run through the bulk API")
    common(p, server=True)
    p.add_argument("--run", default=None, help="run id, id prefix, 1-based index or 'latest' (default latest)")
    p.add_argument("--partitions", type=parse_partitions, default=None, metavar="LIST",
                   help="archive partitions to restore, e.g. 0,3,5-9 (default all)")
    p.add_argument("--key-filter", type=_regex, default=None, metavar="REGEX",
                   help="restore only keys matching this regex (re.search)")
    p.add_argument("--dry-run", action="store_true", help="print what would be written; contact no server")
    p.add_argument("--restart", action="store_true", help="ignore the journal of an interrupted restore")
    p.add_argument("--batch", type=int, default=1000, help="items per bulk request (default 1000)")
    p.add_argument("--parallel", type=int, default=4, help="partitions restored at once (default 4)")
    p.set_defaults(func=_guarded(_cmd_restore))

    p = sub.add_parser("merge", help="fold runs FROM..TO into one run")
    common(p)
    p.add_argument("--from", dest="from_run", required=True, help="first run (id, prefix or index)")
    p.add_argument("--to", dest="to_run", required=True, help="last run (id, prefix or index)")
    p.set_defaults(func=_guarded(_cmd_merge))


# ---------------------------------------------------------------------------- helpers
def _console(stderr: bool = False) -> Any:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # pipes get a wide fixed width: rich's 80-column default squeezes run ids and timestamps
    return Console(stderr=stderr, highlight=False, width=None if stream.isatty() else 160)


@contextlib.contextmanager
def _progress(args: argparse.Namespace, label: str) -> Iterator[Callable[[int, int], None] | None]:
    if args.quiet or args.json:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), TimeRemainingColumn(), console=_console(stderr=True)) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _print_json(doc: Any) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")


def _open(args: argparse.Namespace) -> Any:
    from clients.backup.archive import Archive

    return Archive.open(args.archive)


# ---------------------------------------------------------------------------- commands
def _cmd_create(args: argparse.Namespace) -> int:
    from clients.backup.create import create_backup

    with _progress(args, "backing up") as progress:
        result = create_backup(args.archive, args.server, token=args.token, block_bytes=args.block_kib * 1024,
                               level=args.level, idle_timeout=args.timeout, progress=progress, full=args.full)
    if args.json:
        _print_json(result.to_json())
    else:
        m = result.manifest
        rollbacks = [(p, r) for p, rec in sorted(m.partitions.items()) for r in rec.rollbacks]
        _console().print(
            f"run {m.run_id} ({m.kind}{', resumed' if result.resumed else ''}): {result.mutations} mutations, "
            f"{result.deletions} deletions, {result.bytes / 1e6:.1f} MB in {result.seconds:.1f}s "
            f"({result.partitions_taken} partitions streamed, {result.partitions_reused} kept from the interrupted run"
            + (f", {len(result.resumed_at)} continued from its checkpoints" if result.resumed_at else "") + ")")
        for p, r in rollbacks:
            _console().print(f"[yellow]rollback[/] partition {p}: server refused seqno {r.requested.seqno}, "
                             f"retaken from seqno {r.to_seqno}{' (full)' if r.to_seqno == 0 else ''}")
    return 0


def _cmd_info(args: argparse.Namespace) -> int:
    from clients.backup.info import archive_info, render

    archive = _open(args)
    with archive.lock("read"):
        info = archive_info(archive, partitions=args.json or args.detail)
    if args.json:
        _print_json(info)
    else:
        render(info, _console(), detail=args.detail)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from clients.backup.verify import verify

    archive = _open(args)
    with archive.lock("read"), _progress(args, "verifying") as progress:
        report = verify(archive, progress)
    if args.json:
        _print_json({"ok": report.ok, "runs": report.runs, "segments": report.segments, "items": report.items,
                     "bytes": report.bytes, "partial_runs": report.partial_runs,
                     "problems": [p.to_dict() for p in report.problems]})
    else:
        con = _console()
        for p in report.problems:
            con.print(f"[red]problem[/] {p.message}", markup=True, highlight=False)
        for rid in report.partial_runs:
            con.print(f"[yellow]partial run[/] {rid} (interrupted; ignored until `create` resumes it)")
        status = "[green]OK[/]" if report.ok else f"[red]{len(report.problems)} problem(s)[/]"
        con.print(f"verify {status}: {report.runs} runs, {report.segments} segments, {report.items} items, "
                  f"{report.bytes / 1e6:.1f} MB")
    return 0 if report.ok else 1


def _cmd_restore(args: argparse.Namespace) -> int:
    from clients.backup.plan import summarize
    from clients.backup.restore import check_partitions, restore

    archive = _open(args)
    with archive.lock("read"):
        if args.dry_run:
            target = archive.find_run(args.run)
            parts = check_partitions(target, args.partitions)
            rx = re.compile(args.key_filter) if args.key_filter else None
            s = summarize(archive, args.run, parts, rx)
            if args.json:
                _print_json({"run_id": s.run_id, "sets": s.sets, "deletes": s.deletes, "filtered_out": s.skipped_keys,
                             "partitions": {str(p): {"sets": a, "deletes": b} for p, (a, b) in s.partitions.items()}})
            else:
                _console().print(f"dry run: restoring run {s.run_id} would set {s.sets} keys and delete {s.deletes} "
                                 f"in {len(s.partitions)} partitions ({s.skipped_keys} keys filtered out)")
            return 0
        with _progress(args, "restoring") as progress:
            rep = restore(archive, args.server, token=args.token, run_spec=args.run, partitions=args.partitions,
                          key_filter=args.key_filter, restart=args.restart, batch_items=args.batch,
                          parallel=args.parallel, progress=progress)
    if args.json:
        _print_json({"run_id": rep.run_id, "sets": rep.sets, "deletes": rep.deletes, "partitions": rep.partitions,
                     "skipped_partitions": rep.skipped, "rewritten_partitions": rep.rewritten, "filtered_out": rep.filtered_out, "seconds": rep.seconds})
    else:
        _console().print(f"restored run {rep.run_id}: {rep.sets} sets, {rep.deletes} deletes in "
                         f"{len(rep.partitions)} partitions in {rep.seconds:.1f}s"
                         + (f" ({len(rep.skipped)} partitions already done by an interrupted restore)"
                            if rep.skipped else ""))
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    from clients.backup.merge import merge

    archive = _open(args)
    with _progress(args, "merging") as progress:
        m = merge(archive, args.from_run, args.to_run, progress)
    if args.json:
        from clients.backup.info import run_info

        _print_json(run_info(m, partitions=False))
    else:
        _console().print(f"merged {len(m.merged_from)} runs into {m.run_id}: {m.mutations} mutations, "
                         f"{m.deletions} deletions, {m.bytes / 1e6:.1f} MB")
    return 0


def _guarded(cmd: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """The error contract: typed errors become one clear line on stderr and exit status 1."""

    def run(args: argparse.Namespace) -> int:
        try:
            return int(cmd(args))
        except UprError as exc:
            print(f"upr backup {args.backup_command}: error: {exc}", file=sys.stderr)
            return exit_code(exc)
        except KeyboardInterrupt:
            print("upr backup: interrupted; the archive is still valid (a partial run resumes next time)",
                  file=sys.stderr)
            return 130

    run.__name__ = cmd.__name__
    return run


def main(argv: list[str] | None = None) -> int:
    """Standalone entry (``python -m clients.backup.cli backup ...``) for tests and scripts."""
    parser = argparse.ArgumentParser(prog="upr")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
