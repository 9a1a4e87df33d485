"""PostgreSQL logical decoding: a ``docs`` table, ``wal_level=logical``, a logical slot.

Writer: COPY a batch into ``docs (key text primary key, doc json)`` and COMMIT; with
``synchronous_commit=on`` and ``fsync=on`` the COMMIT returns once the WAL is flushed, the
strictest ack of the peers (comparable to upr's ``durability=persist``). A permanent slot
(test_decoding) exists for every workload, so writes pay for WAL retention as they would in use.
Reader: ``pg_logical_slot_get_changes`` in a loop (up to 10,000 changes per call), parsing each
test_decoding line for the document; tail consumers create a temporary slot of their own and poll
(psycopg 3 has no replication-protocol client, so polling is how a Python consumer reads it).

As root, initdb and postgres refuse to run, so both run as the ``postgres`` system user created by
the Debian package (``subprocess.Popen(user=...)``, which keeps the PID ours to stop).
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from bench.suite.adapter import Doc, Start, System
from bench.suite.install import InstallLog, Skip, command_version, ensure_debian_package, ensure_python
from bench.suite.procs import ProcessGroup, free_port, log_tail, wait_for_port

SLOT = "upr_bench"
_MARK = "doc[json]:'"
TAIL_POLL_S = 0.001
FANOUT_POLL_S = 0.005


def find_bindir() -> str | None:
    """The newest PostgreSQL server binaries: the Debian layout first, then PATH."""
    for d in sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(p.split("/")[-2]), reverse=True):
        if os.access(os.path.join(d, "postgres"), os.X_OK) and os.access(os.path.join(d, "initdb"), os.X_OK):
            return d
    found = shutil.which("postgres")
    if found and shutil.which("initdb"):
        return os.path.dirname(os.path.realpath(found))
    return None


class PostgresSystem(System):
    name = "postgres"
    label = "PostgreSQL logical decoding"
    stream_module = "bench.peers.postgres"
    durability = "synchronous_commit=on, fsync=on, wal_level=logical, one logical slot (ack = COMMIT, WAL flushed)"
    method = {
        "ingest": "COPY 1000 rows, COMMIT per batch",
        "backfill": "pg_logical_slot_get_changes(upto 10,000) with test_decoding",
        "tail": f"temporary slot, pg_logical_slot_get_changes polled every {TAIL_POLL_S * 1000:g} ms when idle",
        "fanout": f"one temporary slot per consumer, polled every {FANOUT_POLL_S * 1000:g} ms when idle",
    }

    def __init__(self) -> None:
        self.port = 0
        self._bindir = ""
        self._admin: Any = None
        self._user: str | None = None

    def prepare(self, log: InstallLog) -> dict[str, str]:
        self._bindir = ensure_debian_package(log, "postgresql", find_bindir)
        versions = ensure_python(log, ["psycopg[binary]>=3.1"], ["psycopg"])
        if os.geteuid() == 0:
            try:
                pwd.getpwnam("postgres")
            except KeyError:
                raise Skip("running as root and there is no 'postgres' user to run the server as") from None
            self._user = "postgres"
        return {"server": command_version([os.path.join(self._bindir, "postgres"), "--version"]), **versions}

    async def start(self, procs: ProcessGroup, workdir: Path) -> None:
        import psycopg

        base = workdir / "postgres"
        base.mkdir(parents=True, exist_ok=True)
        data = base / "data"
        if self._user is not None:  # the server user must be able to reach its data dir
            for d in [base, *base.parents]:
                if d == Path(tempfile.gettempdir()) or d == d.parent:
                    break
                if d.stat().st_uid == os.geteuid():
                    os.chmod(d, d.stat().st_mode | 0o011)
            os.chown(base, pwd.getpwnam(self._user).pw_uid, pwd.getpwnam(self._user).pw_gid)
        init = subprocess.run(
            [os.path.join(self._bindir, "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust",
             "-E", "UTF8", "--no-sync"],
            capture_output=True, text=True, timeout=120, user=self._user, group=self._user,
            extra_groups=[] if self._user else None, check=False,
        )
        if init.returncode != 0:
            raise Skip(f"initdb failed: {(init.stderr or init.stdout).strip()[-300:]}")
        self.port = free_port()
        log = base / "postgres.log"
        if self._user is not None:
            log.touch()
            os.chown(log, pwd.getpwnam(self._user).pw_uid, pwd.getpwnam(self._user).pw_gid)
        settings = {
            "listen_addresses": "127.0.0.1", "port": str(self.port), "unix_socket_directories": str(base),
            "wal_level": "logical", "synchronous_commit": "on", "fsync": "on",
            "max_replication_slots": "80", "max_wal_senders": "10", "max_connections": "200",
            "shared_buffers": "256MB", "max_wal_size": "4GB",
        }
        argv = [os.path.join(self._bindir, "postgres"), "-D", str(data)]
        for k, v in settings.items():
            argv += ["-c", f"{k}={v}"]
        proc = procs.spawn(argv, name="postgres", log=log, stop_signal=signal.SIGINT, user=self._user)
        wait_for_port(self.port, proc, log)
        for _ in range(100):  # accepting TCP comes a little before accepting logins
            try:
                self._admin = await psycopg.AsyncConnection.connect(**_dsn(self.port), autocommit=True)
                break
            except psycopg.OperationalError:
                await asyncio.sleep(0.1)
        else:
            raise Skip(f"postgres did not accept connections: {log_tail(log)}")

    async def reset(self, *, empty: bool = True) -> None:
        a = self._admin
        await a.execute("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = %s",
                        (SLOT,))
        await a.execute("DROP TABLE IF EXISTS docs")
        await a.execute("CREATE TABLE docs (key text PRIMARY KEY, doc json NOT NULL)")
        await a.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding')", (SLOT,))

    async def writer(self) -> _Writer:
        import psycopg

        return _Writer(await psycopg.AsyncConnection.connect(**_dsn(self.port)))

    def consumer_conn(self) -> dict[str, Any]:
        return {"port": self.port, "slot": SLOT}

    async def stop(self) -> None:
        if self._admin is not None:
            await self._admin.close()
            self._admin = None


def _dsn(port: int) -> dict[str, Any]:
    return {"host": "127.0.0.1", "port": port, "user": "postgres", "dbname": "postgres"}


class _Writer:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def write(self, docs: Sequence[Doc]) -> None:
        data = b"".join(k.encode() + b"\t" + d + b"\n" for k, d in docs)
        async with self._conn.cursor() as cur:
            async with cur.copy("COPY docs (key, doc) FROM STDIN") as copy:
                await copy.write(data)
        await self._conn.commit()

    async def close(self) -> None:
        await self._conn.close()


def _extract(line: str) -> str | None:
    at = line.find(_MARK)
    return line[at + len(_MARK) : -1] if at >= 0 else None


async def open_stream(conn: dict[str, Any], start: Start, ident: int) -> AsyncIterator[list[bytes | str]]:
    import psycopg

    pg = await psycopg.AsyncConnection.connect(**_dsn(conn["port"]), autocommit=True)
    try:
        if start == "beginning":
            slot, upto, poll = conn["slot"], 10_000, TAIL_POLL_S
        else:
            slot = f"upr_bench_tail_{os.getpid()}_{ident}"
            upto, poll = None, (TAIL_POLL_S if ident == 0 else FANOUT_POLL_S)
            await pg.execute("SELECT pg_create_logical_replication_slot(%s, 'test_decoding', true)", (slot,))
        query = ("SELECT data FROM pg_logical_slot_get_changes(%s, NULL, %s, "
                 "'include-xids', '0', 'skip-empty-xacts', '1')")
        yield []
        while True:
            cur = await pg.execute(query, (slot, upto))
            rows = await cur.fetchall()
            docs: list[bytes | str] = []
            for (line,) in rows:
                doc = _extract(line)
                if doc is not None:
                    docs.append(doc)
            if docs:
                yield docs
            else:
                if start == "beginning":
                    yield []
                await asyncio.sleep(poll)
    finally:
        await pg.close()
