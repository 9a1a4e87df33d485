"""``info``: what is in an archive, as a JSON-ready dict (``--json``) and as rich tables."""
from __future__ import annotations

import datetime as dt
from typing import Any

from clients.backup.archive import Archive, disk_usage
from clients.backup.manifest import RunManifest


def _ts(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def run_info(run: RunManifest, *, partitions: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "run_id": run.run_id,
        "kind": run.kind,
        "started_at": _ts(run.started_at),
        "finished_at": _ts(run.finished_at),
        "duration_s": round(run.finished_at - run.started_at, 3),
        "mutations": run.mutations,
        "deletions": run.deletions,
        "bytes": run.bytes,
        "resumed": run.resumed,
        "merged_from": list(run.merged_from),
        "rollbacks": [
            {"partition": p, "from": rb.requested.to_dict(), "to_seqno": rb.to_seqno, "reason": rb.reason}
            for p, rec in sorted(run.partitions.items()) for rb in rec.rollbacks
        ],
        "restarts": [
            {"partition": p, "server_point": point, "restarted_at": at}
            for p, rec in sorted(run.partitions.items()) for point, at in rec.restarts
        ],
    }
    if partitions:
        out["partitions"] = {
            str(p): {
                "start": rec.start.to_dict(), "end": rec.end.to_dict(),
                "mutations": rec.mutations, "deletions": rec.deletions, "bytes": rec.bytes,
                "segment": rec.segment, "rolled_back": rec.rolled_back,
            }
            for p, rec in sorted(run.partitions.items())
        }
    return out


def archive_info(archive: Archive, *, partitions: bool = True) -> dict[str, Any]:
    runs = archive.runs()
    return {
        "archive": str(archive.root),
        "node_id": archive.meta.node_id,
        "partition_count": archive.meta.partition_count,
        "created_at": _ts(archive.meta.created_at),
        "disk_bytes": disk_usage(archive.root),
        "runs": [run_info(r, partitions=partitions) for r in runs],
        "partial_runs": [_partial(archive, rid) for rid in archive.partial_runs()],
    }


def _partial(archive: Archive, run_id: str) -> dict[str, Any]:
    """How far an interrupted run got: committed partitions and unfinished segments' bytes."""
    rdir = archive.run_dir(run_id)
    done = len(list((rdir / "parts").glob("p[0-9][0-9][0-9][0-9].json")))
    return {"run_id": run_id, "partitions_done": done, "partitions": archive.meta.partition_count,
            "bytes": disk_usage(rdir)}


def _size(n: int) -> str:
    f = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if f < 1024 or unit == "GiB":
            return f"{f:.0f} {unit}" if unit == "B" else f"{f:.1f} {unit}"
        f /= 1024
    return str(n)


def render(info: dict[str, Any], console: Any, *, detail: bool = False) -> None:
    """Print ``info`` with rich: a runs table, rollbacks, and per-partition ranges if ``detail``."""
    from rich.table import Table

    console.print(f"[bold]Archive[/] {info['archive']}  keyspace {info['node_id']}  "
                  f"{info['partition_count']} partitions  created {info['created_at']}  "
                  f"on disk {_size(info['disk_bytes'])}")
    table = Table(title="Runs")
    for col in ("#", "run", "kind", "started", "duration", "mutations", "deletions", "size", "rollbacks"):
        table.add_column(col, justify="right" if col in {"#", "mutations", "deletions", "size", "rollbacks"} else "left")
    for n, run in enumerate(info["runs"], 1):
        kind = run["kind"] + (f" (resumed x{run['resumed']})" if run["resumed"] else "")
        table.add_row(str(n), run["run_id"], kind, run["started_at"], f"{run['duration_s']:.1f}s",
                      str(run["mutations"]), str(run["deletions"]), _size(run["bytes"]), str(len(run["rollbacks"])))
    console.print(table)
    for run in info["runs"]:
        for rb in run["rollbacks"]:
            console.print(f"[yellow]rollback[/] run {run['run_id']} partition {rb['partition']}: server refused "
                          f"seqno {rb['from']['seqno']} (uuid {rb['from']['uuid']}), retaken from seqno "
                          f"{rb['to_seqno']}{' (full)' if rb['to_seqno'] == 0 else ''}"
                          f"{' - ' + rb['reason'] if rb['reason'] else ''}")
        for rs in run["restarts"]:
            console.print(f"[yellow]restart[/] run {run['run_id']} partition {rs['partition']}: the server restarted "
                          f"mid-run (server point {rs['server_point']}); cut back to seqno "
                          f"{rs['restarted_at']} and streamed again")
    for pr in info["partial_runs"]:
        console.print(f"[yellow]partial run[/] {pr['run_id']}: interrupted with {pr['partitions_done']} of "
                      f"{pr['partitions']} partitions done ({_size(pr['bytes'])} written); the next "
                      f"`upr backup create` continues it")
    if detail:
        for run in info["runs"]:
            t = Table(title=f"Run {run['run_id']} per partition")
            for col in ("p", "uuid", "start", "end", "snapshot", "mutations", "deletions", "size"):
                t.add_column(col, justify="right")
            for p, rec in run["partitions"].items():
                end = rec["end"]
                t.add_row(p + (" R" if rec["rolled_back"] else ""), str(end["uuid"]), str(rec["start"]["seqno"]),
                          str(end["seqno"]), f"{end['snap_start']}..{end['snap_end']}", str(rec["mutations"]),
                          str(rec["deletions"]), _size(rec["bytes"]))
            console.print(t)
