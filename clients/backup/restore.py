"""``restore``: the planned state of a run, written through ``POST /docs/_bulk``.

Idempotent: every key is set to its archived value or deleted, so replaying a batch (after a crash,
a timeout, a resumed restore) converges to the same state; a delete of a key the target does not
have counts as done.  A partition's batches go at ``memory`` and its last one at a level whose
wait covers them all (``persist`` on one node, ``persist_majority`` in a cluster); a partition
whose active changed on the way is written again from its first batch (``partition_rounds``).
Resumable: once that last batch is acknowledged the partition is recorded in a journal
(``ARCHIVE/restores/<id>.json``, atomic), and a restore with the same target, run and filters
skips journaled partitions.
Transient failures (unreachable server, 429, 503) are retried with backoff; anything else stops the
restore with an error naming partition, seqno and key.
"""
from __future__ import annotations

import base64
import hashlib
import re
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from clients.backup.archive import Archive
from clients.backup.errors import RestoreFailed
from clients.backup.fsutil import atomic_write
from clients.backup.manifest import RunManifest
from clients.backup.partition_rounds import Done, Fail, PartitionRounds, Route, Send
from clients.backup.plan import plan_partitions, runs_upto
from clients.backup.targets import MOVED_STATUSES, PartitionTargets
from clients.errors import ConnectionFailed, HttpError
from clients.http import HttpApi
from engine.core.errors import InvalidPartition
from engine.core.types import Item

RETRY_STATUSES = {429, 502, 503, 504}
#: problem types of a durable wait that did not succeed: the caller decides (``PartitionRounds``)
DURABILITY_REFUSALS = {"durability-ambiguous", "durability-impossible"}


@dataclass(frozen=True, slots=True)
class Ack:
    """A bulk answer, who gave it, and whether a sign of a move was met before it."""

    results: list[dict[str, Any]]
    route: Route
    disturbed: bool = False


class DurabilityRefused(Exception):
    """A batch's durable wait answered 504 ``durability-ambiguous`` or 503 ``durability-impossible``."""

    def __init__(self, detail: str, route: Route, disturbed: bool) -> None:
        super().__init__(detail)
        self.detail, self.route, self.disturbed = detail, route, disturbed


@dataclass(slots=True)
class RestoreReport:
    run_id: str
    partitions: list[int] = field(default_factory=list)
    skipped: list[int] = field(default_factory=list)  # already done according to the journal
    rewritten: list[int] = field(default_factory=list)  # written again: their active changed mid-restore
    sets: int = 0
    deletes: int = 0
    filtered_out: int = 0
    seconds: float = 0.0


class BulkClient:
    """The one endpoint restore needs (``HttpApi.bulk``), with retries for what is safe to retry
    (everything: idempotent).  In a cluster each partition's batch goes to its active node
    (``targets``), and a batch that met a moved partition or a lost node is sent again after
    the map was read again."""

    def __init__(self, server: str, token: str | None = None, *, timeout: float = 60.0, retries: int = 8,
                 targets: PartitionTargets | None = None) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout = timeout
        self.targets = targets
        self._apis: dict[str, HttpApi] = {}
        self.retries = retries

    def _api(self, url: str) -> HttpApi:
        api = self._apis.get(url)
        if api is None:
            api = self._apis[url] = HttpApi(url, self.token, timeout=self.timeout)
        return api

    def close(self) -> None:
        for api in self._apis.values():
            api.close()

    def write(self, ops: list[dict[str, Any]], *, persist: bool, partition: int | None = None) -> list[dict[str, Any]]:
        return self.send(ops, "persist" if persist else "memory", partition).results

    def route_of(self, partition: int | None) -> Route:
        """Where ``partition``'s writes go now, with the epoch of the map that says so."""
        targets = self.targets if self.targets is not None and self.targets.cluster else None
        if targets is None or partition is None:
            return Route(self.server)
        return Route(targets.url_of(partition) or "", targets.epoch_of(partition))

    def branch_of(self, partition: int, url: str | None = None, attempts: int = 3) -> int | None:
        """The newest failover-log uuid of ``partition`` on ``url`` (its active by default): a
        new one means its history branched (a promotion, a crash restart).  None when no answer
        came: the caller cannot rule a branch out."""
        delay = 0.2
        for attempt in range(attempts):
            where = url or self.route_of(partition).url
            try:
                if where:
                    log = self._api(where).partition(partition).get("failover_log") or []
                    return int(log[0]["uuid"]) if log else None
            except (ConnectionFailed, HttpError):
                pass
            if attempt + 1 < attempts:
                time.sleep(delay)
                delay *= 2
                if self.targets is not None and self.targets.cluster:
                    try:
                        self.targets.refresh()
                    except ConnectionFailed:
                        pass
        return None

    def send(self, ops: list[dict[str, Any]], durability: str, partition: int | None = None) -> Ack:
        """One batch, sent again after anything safe to retry; the answer says who acknowledged it
        and whether a sign of a move (a lost node, a 421/503 item, a 5xx) was met on the way.
        A durable wait answered 504/503 is not retried here: ``DurabilityRefused`` goes to the
        caller, whose ``PartitionRounds`` decides between sending the batch again and a redo."""
        delay = 0.2
        targets = self.targets if self.targets is not None and self.targets.cluster else None
        why = "no attempt"
        disturbed = False
        for attempt in range(self.retries + 1):
            route = self.route_of(partition)
            url = self.server if targets is None or partition is None else route.url or None
            try:
                if url is None:
                    why = f"partition {partition} has no active node (map revision {targets.revision})"  # type: ignore[union-attr]
                else:
                    results: list[dict[str, Any]] = self._api(url).bulk(ops, durability=durability)["results"]
                    moved = [r for r in results if r.get("status") in MOVED_STATUSES]
                    if targets is None or not moved:
                        return Ack(results, route, disturbed)
                    why = f"partition {partition}: {url} answered {moved[0].get('status')}"
                if attempt == self.retries:
                    if url is None:
                        break
                    return Ack(results, route, True)  # the 421s are reported as refused items
            except ConnectionFailed as exc:
                if attempt == self.retries:
                    raise
                why = str(exc)
            except HttpError as exc:
                if exc.server_code in DURABILITY_REFUSALS:
                    if targets is not None:  # "no longer active" is one of its reasons: the retry goes by a fresh map
                        try:
                            targets.refresh()
                        except ConnectionFailed:
                            pass
                    raise DurabilityRefused(str(exc), route, disturbed) from None
                if exc.status not in RETRY_STATUSES or attempt == self.retries:
                    raise
                why = str(exc)
                if exc.status == 429:  # the node is busy, not gone
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    continue
            disturbed = True
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            if targets is not None:
                try:
                    targets.refresh()
                except ConnectionFailed as exc:
                    why = f"{why}; {exc}"
        raise RestoreFailed(f"partition {partition}: gave up after {self.retries + 1} attempts ({why})",
                            partition=partition)


def _op(item: Item) -> dict[str, Any]:
    key = item.key.decode("utf-8", "surrogateescape")
    if item.deleted:
        return {"op": "delete", "key": key}
    return {"op": "set", "key": key, "value_b64": base64.b64encode(item.value).decode("ascii")}


def _batches(items: Sequence[Item], max_items: int, max_bytes: int) -> Iterable[list[Item]]:
    batch: list[Item] = []
    size = 0
    for it in items:
        cost = len(it.key) + len(it.value) * 4 // 3 + 64
        if batch and (len(batch) >= max_items or size + cost > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(it)
        size += cost
    if batch:
        yield batch


class Journal:
    """Which partitions of one (target, run, filter) restore are durably done."""

    def __init__(self, archive: Archive, server: str, run_id: str, partitions: Sequence[int],
                 key_filter: str | None) -> None:
        ident = orjson.dumps({"server": server, "run": run_id, "partitions": list(partitions), "filter": key_filter},
                             option=orjson.OPT_SORT_KEYS)
        self.path = archive.root / "restores" / (hashlib.sha256(ident).hexdigest()[:20] + ".json")
        self.doc: dict[str, Any] = {"server": server, "run_id": run_id, "filter": key_filter, "done": []}
        try:
            loaded = orjson.loads(self.path.read_bytes())
            if isinstance(loaded, dict) and isinstance(loaded.get("done"), list):
                self.doc["done"] = [int(p) for p in loaded["done"]]
        except (FileNotFoundError, orjson.JSONDecodeError, ValueError, TypeError):
            pass

    @property
    def done(self) -> set[int]:
        return set(self.doc["done"])

    def mark(self, partition: int) -> None:
        self.doc["done"] = sorted(self.done | {partition})
        self.path.parent.mkdir(exist_ok=True)
        atomic_write(self.path, orjson.dumps(self.doc))

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)

    def reset(self) -> None:
        self.doc["done"] = []
        self.path.unlink(missing_ok=True)


def check_partitions(target: RunManifest, partitions: Sequence[int] | None) -> list[int]:
    if partitions is None:
        return sorted(target.partitions)
    for p in partitions:
        if p not in target.partitions:
            raise InvalidPartition(f"partition {p} is not in the archive (it has 0..{target.partition_count - 1})",
                                   field="partitions", partition=p)
    return sorted(set(partitions))


def restore(
    archive: Archive,
    server: str | Sequence[str],
    *,
    token: str | None = None,
    run_spec: str | None = None,
    partitions: Sequence[int] | None = None,
    key_filter: str | None = None,
    restart: bool = False,
    batch_items: int = 1000,
    batch_bytes: int = 4 << 20,
    parallel: int = 4,
    progress: Callable[[int, int], None] | None = None,
) -> RestoreReport:
    """Restore the state as of ``run_spec``; ``progress(done, total)`` counts archived items.

    ``parallel`` partitions are restored at once (each plans and writes its own partition): the
    server's write path, not the client, is the bottleneck, and overlapping requests hides each
    partition's final durable wait.

    ``server``: one node, or a cluster's nodes (a list or "URL,URL"): each partition's writes go
    to its active node per the map, following moves (``targets``)."""
    t0 = time.perf_counter()
    server = server if isinstance(server, str) else ",".join(server)
    target, runs = runs_upto(archive, run_spec)
    parts = check_partitions(target, partitions)
    rx = re.compile(key_filter) if key_filter else None
    journal = Journal(archive, server, target.run_id, parts, key_filter)
    if restart:
        journal.reset()
    report = RestoreReport(target.run_id)
    report.skipped = sorted(journal.done & set(parts))
    todo = [p for p in parts if p not in journal.done]
    # progress counts archived items read (an upper bound of what is written; exact at each partition end)
    per_part = {p: sum(r.partitions[p].mutations + r.partitions[p].deletions for r in runs) for p in parts}
    total = sum(per_part[p] for p in todo)
    lock = threading.Lock()
    done = [0]

    def advance(n: int) -> None:
        with lock:
            done[0] += n
            if progress:
                progress(done[0], total)

    local = threading.local()
    clients: list[BulkClient] = []
    targets = PartitionTargets(server, token) if todo else None  # a cluster: each partition to its active

    def client_of_thread() -> BulkClient:
        if not hasattr(local, "client"):  # one connection pool per worker thread
            local.client = BulkClient(server, token, targets=targets)
            with lock:
                clients.append(local.client)
        return local.client

    def one(p: int) -> None:
        client = client_of_thread()
        cluster = targets is not None and targets.cluster
        for plan, skipped in plan_partitions(archive, runs, [p], rx):
            batches = list(_batches(plan.items, batch_items, batch_bytes))
            if batches:
                rounds = _write_rounds(client, p, batches, cluster, advance)
                if rounds > 1:
                    with lock:
                        report.rewritten.append(p)
            advance(per_part[p] - sum(len(b) for b in batches))  # what the plan folded away counts as done too
            with lock:
                report.filtered_out += skipped
                report.sets += plan.sets
                report.deletes += plan.deletes
                journal.mark(p)
                report.partitions.append(p)

    try:
        with ThreadPoolExecutor(max(1, parallel), thread_name_prefix="upr-restore") as pool:
            futures = [pool.submit(one, p) for p in todo]
            try:
                for fut in futures:
                    fut.result()
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
    finally:
        for c in clients:
            c.close()
    report.partitions.sort()
    report.rewritten.sort()
    journal.finish()
    report.seconds = time.perf_counter() - t0
    return report


def _write_rounds(client: BulkClient, p: int, batches: list[list[Item]], cluster: bool,
                  advance: Callable[[int], None]) -> int:
    """Write partition ``p``'s batches as ``PartitionRounds`` says until it is done; the number of
    rounds it took.  ``advance`` counts each item once, however many rounds write it."""
    rounds = PartitionRounds(p, len(batches), cluster=cluster)
    step = rounds.start()
    reported = 0
    written = 0
    while isinstance(step, Send):
        if step.delay_s:
            time.sleep(step.delay_s)
        batch = batches[step.batch]
        last = step.batch == len(batches) - 1
        if step.batch == 0:
            written = 0
            if not last:  # before anything of the round is acknowledged: a later branch shows at the end
                rounds.branch_before(client.branch_of(p))
        try:
            ack = _write(client, p, batch, step.durability)
        except DurabilityRefused as exc:
            step = rounds.refused(exc.route, exc.detail, disturbed=exc.disturbed, seqno=batch[-1].seqno)
            continue
        written += len(batch)
        if written > reported:
            advance(written - reported)
            reported = written
        branch = client.branch_of(p, ack.route.url) if last and len(batches) > 1 else None
        step = rounds.acked(step.batch, ack.route, disturbed=ack.disturbed, seqno=batch[-1].seqno, branch=branch)
    if isinstance(step, Fail):
        raise RestoreFailed(step.message, partition=p, seqno=step.seqno)
    assert isinstance(step, Done)
    return step.rounds


def _write(client: BulkClient, p: int, batch: list[Item], durability: str) -> Ack:
    """One bulk request; a server whose limits are lower than our batch (413) gets halves (the
    answer of the second half, disturbed if the halves met different routes or a move)."""
    try:
        ack = client.send([_op(i) for i in batch], durability, partition=p)
    except HttpError as exc:
        if exc.status != 413 or len(batch) == 1:
            raise
        half = len(batch) // 2
        first = _write(client, p, batch[:half], "memory")
        second = _write(client, p, batch[half:], durability)
        return Ack([], second.route, first.disturbed or second.disturbed or first.route != second.route)
    _check_results(p, batch, ack.results)
    return ack


def _check_results(p: int, batch: list[Item], results: list[dict[str, Any]]) -> None:
    if len(results) != len(batch):
        raise RestoreFailed(f"partition {p}: the server answered {len(results)} results for {len(batch)} items",
                            partition=p)
    for item, res in zip(batch, results):
        status = res.get("status")
        if status == 200 or (item.deleted and status == 404):
            continue
        err = res.get("error") or {}
        detail = err.get("detail") or err.get("title") or err
        key = item.key.decode("utf-8", "replace")
        raise RestoreFailed(
            f"partition {p}, seqno {item.seqno}, key {key!r}: the server refused the "
            f"{'delete' if item.deleted else 'set'} (HTTP {status}: {detail})",
            partition=p, seqno=item.seqno, key=key)
