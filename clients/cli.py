"""The client commands of the ``upr`` CLI: tail, status, partitions, failover-log, put/get/delete, barrier.

``app.cli`` imports this module lazily and calls ``register(subparsers)``.  Every command takes
``--server`` (default ``$UPR_SERVER`` or http://127.0.0.1:8000) and ``--token`` (default ``$UPR_TOKEN``);
the informational ones print a human summary by default and raw JSON with ``--json``.

In a cluster ``--server`` may name several nodes (``URL,URL``), tried in order until one accepts a
connection; ``put``/``get``/``delete`` follow a ``421 misdirected-request`` to the partition's active
node (at most 3 hops, then one error line and exit 1).

``upr tail`` prints one JSON object per change (kcat-like), always as JSON lines::

    {"partition":3,"seqno":17,"key":"k","op":"mutation","cas":..,"rev":..,"value":"text"}
    {"partition":3,"seqno":18,"key":"k","op":"deletion","cas":..,"rev":..}
    {"partition":3,"op":"reset"}      # the rollback went deeper than the ring: drop partition 3

``value_b64`` replaces ``value`` when the bytes are not UTF-8.  With ``--from state:DIR`` the consumer
state and ring live in DIR: a line counts as processed once written and flushed, so repeated runs
print exactly what changed since the last one, and after a server rollback the corrections (the
affected keys' current versions) come first as ordinary lines; applying every line in order yields
the server's data.

SIGTERM (how systemd and Kubernetes stop a service) stops ``upr tail`` like Ctrl-C: the position is
saved before it exits; while the stream is idle the position is saved within a second anyway, so
even a SIGKILL after a quiet spell re-prints nothing.

Exit codes: 0 ok, 1 error (including "not found"), 2 bad arguments, 3 server unreachable,
4 bad or insufficient token, 130 Ctrl-C, 143 SIGTERM.
"""
from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, BinaryIO

import orjson

from engine.core.errors import UprError
from engine.protocol.frames import ItemBatch

from .cli_support import EXIT_ERROR, EXIT_OK, exit_code, parse_partitions

#: ``upr tail`` stopped by SIGTERM after saving its position (what a shell reports for the signal).
EXIT_SIGTERM = 128 + signal.SIGTERM
from .http import HttpApi, default_server, default_token

__all__ = ["register", "main", "parse_partitions", "change_line", "exit_code"]

# ---------------------------------------------------------------------------------------------- helpers
def _from_arg(text: str) -> str:
    if text in ("beginning", "now") or (text.startswith("state:") and len(text) > len("state:")):
        return text
    raise argparse.ArgumentTypeError(f"--from must be beginning, now or state:DIR, got {text!r}")


def _value_fields(value: bytes) -> dict[str, str]:
    try:
        return {"value": value.decode("utf-8")}
    except UnicodeDecodeError:
        return {"value_b64": base64.b64encode(value).decode("ascii")}


def change_line(partition: int, seqno: int, key: str, deleted: bool, cas: int, rev: int, value: bytes) -> bytes:
    """One ``upr tail`` line (without the newline)."""
    obj: dict[str, Any] = {"partition": partition, "seqno": seqno, "key": key,
                           "op": "deletion" if deleted else "mutation", "cas": cas, "rev": rev}
    if not deleted:
        obj.update(_value_fields(value))
    return orjson.dumps(obj)


def _batch_lines(batch: ItemBatch) -> bytes:
    p = batch.partition
    lines = []
    dumps = orjson.dumps
    for key, seqno, cas, rev, deleted, value in batch.rows():
        if deleted:
            obj: dict[str, Any] = {"partition": p, "seqno": seqno, "key": key.decode(), "op": "deletion",
                                   "cas": cas, "rev": rev}
        else:
            obj = {"partition": p, "seqno": seqno, "key": key.decode(), "op": "mutation", "cas": cas, "rev": rev}
            try:
                obj["value"] = value.decode("utf-8")
            except UnicodeDecodeError:
                obj["value_b64"] = base64.b64encode(value).decode("ascii")
        lines.append(dumps(obj))
    lines.append(b"")
    return b"\n".join(lines)


def _common(p: argparse.ArgumentParser, json_flag: bool = True, *, several: bool = True) -> None:
    if several:
        p.add_argument("--server", default=None, metavar="URL[,URL...]",
                       help="server base URL; in a cluster, any nodes, tried in order until one connects "
                            "(default: $UPR_SERVER or http://127.0.0.1:8000)")
    else:
        p.add_argument("--server", default=None, metavar="URL",
                       help="server base URL (default: $UPR_SERVER or http://127.0.0.1:8000)")
    p.add_argument("--token", default=None, help="bearer token (default: $UPR_TOKEN)")
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON instead of a human summary")


def _server(args: argparse.Namespace) -> str:
    return args.server or default_server()


def _token(args: argparse.Namespace) -> str | None:
    return args.token if args.token is not None else default_token()


def _err(message: str) -> None:
    print(f"upr: error: {message}", file=sys.stderr)


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Turn typed errors into one stderr line and an exit code."""

    def run(args: argparse.Namespace) -> int:
        try:
            return fn(args)
        except UprError as exc:
            _err(exc.message)
            return exit_code(exc)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            return EXIT_OK

    return run


def _print_json(obj: Any) -> None:
    sys.stdout.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2).decode() + "\n")


# ---------------------------------------------------------------------------------------------- tail
async def _tail(args: argparse.Namespace, out: BinaryIO) -> int:
    from .consumer import Consumer

    start = args.start
    state: str | None = None
    if start.startswith("state:"):
        state, start = start[len("state:"):], "saved"
    consumer = Consumer(_server(args), token=_token(args), name=args.name, partitions=args.partitions, start=start,
                        state=state, ring_size=args.ring_size if state else 0, until_now=args.until == "now",
                        max_reconnect_attempts=args.reconnect_attempts)
    with _stopped_by_sigterm() as stopped:
        try:
            await _tail_events(consumer, out)
        except asyncio.CancelledError:
            if not stopped:
                raise
            return EXIT_SIGTERM  # the consumer was closed on the way out: its position is saved
    return EXIT_OK


@contextlib.contextmanager
def _stopped_by_sigterm() -> Iterator[list[int]]:
    """Turn SIGTERM into a cancellation of the current task, as asyncio does for SIGINT.

    systemd and Kubernetes stop services with SIGTERM: its default action ends the process at
    once, before the consumer saves what it processed, and the next run would print it again.
    Cancelling lets ``async with`` close the consumer, which saves.  The list yielded gets the
    signal number once it came."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopped: list[int] = []

    def stop() -> None:
        stopped.append(signal.SIGTERM)
        task.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        yield stopped
    finally:
        loop.remove_signal_handler(signal.SIGTERM)


async def _tail_events(consumer: Any, out: BinaryIO) -> None:
    from .events import BarrierReached, Deletion, Mutation, PartitionReset, Rollback, SnapshotEnd, SnapshotStart, \
        StreamEnd

    async with consumer:
        async for ev in consumer.batches():
            if type(ev) is ItemBatch:
                out.write(_batch_lines(ev))
                out.flush()  # the batch counts as processed (and may be saved) only once it is out
            elif isinstance(ev, (Mutation, Deletion)):  # rollback corrections
                out.write(change_line(ev.partition, ev.seqno, ev.key, isinstance(ev, Deletion), ev.cas, ev.rev,
                                      getattr(ev, "value", b"")) + b"\n")
                out.flush()
            elif isinstance(ev, PartitionReset):
                out.write(orjson.dumps({"partition": ev.partition, "op": "reset"}) + b"\n")
                out.flush()
                print(f"upr: partition {ev.partition}: rollback to {ev.rollback_seqno} ({ev.reason}) is deeper than "
                      "the ring: streaming it again from 0", file=sys.stderr)
            elif isinstance(ev, Rollback):
                print(f"upr: partition {ev.partition}: rollback to {ev.seqno} ({ev.reason}); "
                      f"{ev.corrections} correction(s) follow", file=sys.stderr)
            elif isinstance(ev, (SnapshotStart, SnapshotEnd, StreamEnd, BarrierReached)):
                pass


def _cmd_tail(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_tail(args, sys.stdout.buffer))
    except KeyboardInterrupt:
        return 130


# ---------------------------------------------------------------------------------------------- barrier
async def _barrier(args: argparse.Namespace) -> int:
    from .consumer import Consumer

    consumer = Consumer(_server(args), token=_token(args), name=args.name, partitions=args.partitions, start="now",
                        ring_size=0, handler=lambda event: None, max_reconnect_attempts=0)
    async with consumer:
        reached = await consumer.barrier(timeout=args.timeout)
    if args.json:
        _print_json({"cookie": reached.cookie, "seqnos": {str(k): v for k, v in sorted(reached.seqnos.items())}})
    else:
        total = sum(reached.seqnos.values())
        print(f"barrier reached: {len(reached.seqnos)} partition(s) consistent (sum of seqnos {total})")
    return EXIT_OK


def _cmd_barrier(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(_barrier(args))
    except TimeoutError:
        _err(f"barrier did not come back within {args.timeout}s")
        return EXIT_ERROR


# ---------------------------------------------------------------------------------------------- HTTP commands
def _http(args: argparse.Namespace, call: Callable[[HttpApi], Any], show: Callable[[Any], None]) -> int:
    """One HTTP call: its answer as JSON with ``--json``, else rendered for people by ``show``."""
    with HttpApi(_server(args), _token(args)) as api:
        result = call(api)
    if args.json:
        _print_json(result)
    else:
        show(result)
    return EXIT_OK


def _show_status(st: dict[str, Any]) -> None:
    t = st.get("totals", {})
    print(f"node {st.get('node_id')}  version {st.get('version')}  up {st.get('uptime_s', 0):.0f}s  "
          f"{st.get('partitions')} partitions")
    print(f"items {t.get('items')}  high seqnos {t.get('high_seqno')}  persisted {t.get('persisted_seqno')}  "
          f"queue {t.get('queue_depth')} ({t.get('queue_bytes')} B)  streams {t.get('streams_connected')}")


def _show_partitions(parts: list[dict[str, Any]]) -> None:
    print(f"{'part':>4} {'state':<8} {'high':>10} {'persisted':>10} {'purge':>8} {'items':>9} {'queue':>6}  uuid")
    for p in parts:
        print(f"{p['partition']:>4} {p['state']:<8} {p['high_seqno']:>10} {p['persisted_seqno']:>10} "
              f"{p['purge_seqno']:>8} {p['item_count']:>9} {p['queue_depth']:>6}  {p['uuid']}")


def _cmd_status(args: argparse.Namespace) -> int:
    return _http(args, HttpApi.status, _show_status)


def _cmd_partitions(args: argparse.Namespace) -> int:
    return _http(args, HttpApi.partitions, _show_partitions)


def _cmd_failover_log(args: argparse.Namespace) -> int:
    def show(entries: list[dict[str, Any]]) -> None:
        print(f"partition {args.partition} failover log (newest first):")
        for e in entries:
            print(f"  uuid {e['uuid']:>20}  from seqno {e['seqno']}")

    return _http(args, lambda api: api.partition(args.partition).get("failover_log", []), show)


def _read_value(args: argparse.Namespace) -> bytes:
    if args.value is not None and args.value != "-":
        return args.value.encode()
    return sys.stdin.buffer.read()


def _cmd_put(args: argparse.Namespace) -> int:
    value = _read_value(args)
    return _http(args, lambda api: api.put(args.key, value, cas=args.cas, durability=args.durability),
                 lambda r: print(f"stored {r['key']!r}: partition {r['partition']} seqno {r['seqno']} cas {r['cas']}"))


def _cmd_delete(args: argparse.Namespace) -> int:
    return _http(args, lambda api: api.delete(args.key, cas=args.cas, durability=args.durability),
                 lambda r: print(f"deleted {r['key']!r}: partition {r['partition']} seqno {r['seqno']}"))


def _cmd_get(args: argparse.Namespace) -> int:
    with HttpApi(_server(args), _token(args)) as api:
        doc = api.get(args.key)
    if doc is None:
        _err(f"key {args.key!r} not found")
        return EXIT_ERROR
    if args.json:
        _print_json({"key": doc.key, "partition": doc.partition, "seqno": doc.seqno, "cas": doc.cas,
                     "rev": doc.rev, **_value_fields(doc.value)})
    else:
        sys.stdout.buffer.write(doc.value)
        # a line, like redis-cli or etcdctl print a value (the shell prompt, `read`, `wc -l` expect
        # one); --raw gives the exact bytes, for binary values and byte-exact files
        if not args.raw and not doc.value.endswith(b"\n"):
            sys.stdout.buffer.write(b"\n")
        sys.stdout.flush()
    return EXIT_OK


# ---------------------------------------------------------------------------------------------- parsers
def register(sub: Any) -> None:
    """Add the client subcommands to ``upr``'s subparsers."""
    p = sub.add_parser("tail", help="print changes as JSON lines (like kcat -C)",
                       description="Stream changes as JSON lines: partition, seqno, key, op, cas, rev and value "
                                   "(UTF-8) or value_b64.")
    _common(p, json_flag=False, several=False)
    p.add_argument("--partitions", type=parse_partitions, default=None, metavar="LIST",
                   help="partition ids and ranges, e.g. 0,3,5-7 (default: all)")
    p.add_argument("--from", dest="start", type=_from_arg, default="beginning", metavar="WHERE",
                   help="beginning (default), now, or state:DIR to resume from (and keep) state in DIR")
    p.add_argument("--until", choices=["now"], default=None,
                   help="'now': stop at the high seqnos of when the command started")
    p.add_argument("--name", default="upr-tail", help="consumer name shown by the server")
    p.add_argument("--ring-size", type=int, default=100_000, metavar="N",
                   help="rollback ring entries kept with --from state:DIR (default 100000)")
    p.add_argument("--reconnect-attempts", type=int, default=None, metavar="N",
                   help="give up after N failed reconnects (default: retry forever)")
    p.set_defaults(func=_guard(_cmd_tail))

    p = sub.add_parser("status", help="node status and totals")
    _common(p)
    p.set_defaults(func=_guard(_cmd_status))

    p = sub.add_parser("partitions", help="list partitions with their seqnos")
    _common(p)
    p.set_defaults(func=_guard(_cmd_partitions))

    p = sub.add_parser("failover-log", help="a partition's failover log (newest first)")
    _common(p)
    p.add_argument("partition", type=int, metavar="P")
    p.set_defaults(func=_guard(_cmd_failover_log))

    p = sub.add_parser("put", help="create or replace a document")
    _common(p)
    p.add_argument("key")
    p.add_argument("value", nargs="?", default=None, help="the value (default or '-': read stdin)")
    p.add_argument("--cas", type=int, default=None, help="only if the document's CAS is still this")
    p.add_argument("--durability", choices=["memory", "persist", "majority", "persist_majority"], default=None)
    p.set_defaults(func=_guard(_cmd_put))

    p = sub.add_parser("get", help="print a document's value")
    _common(p)
    p.add_argument("key")
    p.add_argument("--raw", action="store_true",
                   help="write the value's exact bytes, without the newline added after a value that has none")
    p.set_defaults(func=_guard(_cmd_get))

    p = sub.add_parser("delete", help="delete a document")
    _common(p)
    p.add_argument("key")
    p.add_argument("--cas", type=int, default=None)
    p.add_argument("--durability", choices=["memory", "persist", "majority", "persist_majority"], default=None)
    p.set_defaults(func=_guard(_cmd_delete))

    p = sub.add_parser("barrier", help="wait until a consistent point of every partition was streamed")
    _common(p, several=False)
    p.add_argument("--partitions", type=parse_partitions, default=None, metavar="LIST")
    p.add_argument("--name", default="upr-barrier")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds (default 30)")
    p.set_defaults(func=_guard(_cmd_barrier))

    # `upr backup create|info|verify|restore|merge` lives with the backup client.
    from clients.backup.cli import register as register_backup

    register_backup(sub)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the client commands alone (``python -m clients.cli``), e.g. where ``app`` is not installed."""
    parser = argparse.ArgumentParser(prog="upr")
    register(parser.add_subparsers(dest="command", metavar="COMMAND", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
