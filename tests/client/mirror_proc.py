"""A mirror consumer process for the crash tests: applies the change feed to its own SQLite file.

    python -m tests.client.mirror_proc URL STATE_DIR DB_PATH RING_SIZE

Each change is applied in autocommit mode with ``synchronous=OFF``: it reaches the OS before the
handler returns, so it survives a SIGKILL of this process (which is what the tests do), and the
consumer counts it as processed only afterwards.  Prints one line per rollback/reset to stdout.
"""
from __future__ import annotations

import asyncio
import sqlite3
import sys

from clients import Consumer, Deletion, FileStateStore, Mutation, PartitionReset, Rollback
from clients.backoff import Backoff


def open_db(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("pragma journal_mode=wal")
    db.execute("pragma synchronous=off")
    db.execute("create table if not exists docs (key text primary key, partition int, value blob)")
    return db


async def main(url: str, state_dir: str, db_path: str, ring_size: int) -> None:
    db = open_db(db_path)
    consumer = Consumer(url, name="mirror", state=FileStateStore(state_dir), ring_size=ring_size,
                        commit_interval=0.02, backoff=Backoff(0.05, 0.5))
    async with consumer:
        print("connected", flush=True)
        async for ev in consumer:
            t = type(ev)
            if t is Mutation:
                db.execute("insert or replace into docs values (?, ?, ?)", (ev.key, ev.partition, ev.value))
            elif t is Deletion:
                db.execute("delete from docs where key = ?", (ev.key,))
            elif t is PartitionReset:
                db.execute("delete from docs where partition = ?", (ev.partition,))
                print(f"reset {ev.partition} {ev.rollback_seqno}", flush=True)
            elif t is Rollback:
                print(f"rollback {ev.partition} {ev.seqno} {ev.corrections} {ev.reason}", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])))
