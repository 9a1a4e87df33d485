"""Regenerate the console screenshots in docs/ui/ (shown in the README).

    python -m tests.ui.screenshots [--out docs/ui] [--partitions 256] [--no-cluster]

A real node on a scratch data dir, stopped once uncleanly (so the Events page has an unclean
restart), some writes and deletes, a consumer that stalls (so the Streams page has lag) and one
told to roll back; then each page at 1280x800 in Debian's chromium (``tests.ui.browser``).
Then a three-node cluster (etcd from the dev extra) where one node is killed: the cluster's
Overview and Events (``cluster-overview.png``, ``cluster-events.png``).
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from tests.support.server import start_server
from tests.support.wsclient import RawStream, write_docs
from tests.ui.browser import ensure_chromium

ROOT = Path(__file__).resolve().parents[2]


async def _consumers(url: str, partitions: int) -> tuple[RawStream, RawStream]:
    stalled = await RawStream.open(url, name="orders-indexer", codec="json", window=65536, auto_ack=False)
    await stalled.stream(range(partitions))
    stranger = await RawStream.open(url, name="billing-sync", partitions=[3])
    await stranger.send({"type": "stream_request", "partition": 3, "uuid": 7, "start_seqno": 12,
                         "snap_start": 10, "snap_end": 12})
    await stranger.responses(1)
    return stalled, stranger


def cluster_shots(out: Path, chromium: str, work: Path) -> None:
    from playwright.sync_api import sync_playwright

    from tests.cluster.etcd_server import start_etcd
    from tests.cluster.nodes import Cluster, started_in_sync, until

    (work / "etcd").mkdir(parents=True, exist_ok=True)
    etcd = start_etcd(work / "etcd")
    cluster = Cluster(work / "cluster", etcd.url, partitions=64, replicas=1, initial_nodes=3)
    try:
        started_in_sync(cluster, ["n1", "n2", "n3"])
        url = cluster.nodes["n2"].url
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium)
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.goto(url + "/ui/")
            page.wait_for_selector("#nodes-table tbody tr")
            cluster.nodes["n1"].kill()
            until(lambda: all(p["active"] != "n1" for p in cluster.view("n2")["map"]["partitions"]),
                  what="n1's partitions failed over")
            page.wait_for_selector("#event-list li[data-kind=failover]", state="attached", timeout=30_000)
            page.wait_for_timeout(2500)
            page.screenshot(path=str(out / "cluster-overview.png"))
            page.evaluate("() => { location.hash = '#events'; }")
            page.wait_for_timeout(600)
            page.screenshot(path=str(out / "cluster-events.png"))
            print(f"wrote {out / 'cluster-overview.png'} and cluster-events.png")
            browser.close()
    finally:
        cluster.stop_all()
        etcd.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "ui")
    parser.add_argument("--partitions", type=int, default=256)
    parser.add_argument("--no-cluster", action="store_true", help="skip the cluster screenshots")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    chromium = ensure_chromium()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        first = start_server(work, partitions=args.partitions)
        write_docs(first.url, {f"order-{i}": b'{"total": 12}' for i in range(3000)}, durability="persist")
        first.kill()
        node = start_server(work, data_dir=first.data_dir, partitions=args.partitions)
        loop = asyncio.new_event_loop()
        try:
            for round_ in range(6):
                write_docs(node.url, {f"order-{round_}-{i}": b'{"total": 3}' * 40 for i in range(800)})
                time.sleep(1.0)  # a few seconds of chart
            write_docs(node.url, {f"order-{i}": None for i in range(200)})
            streams = loop.run_until_complete(_consumers(node.url, args.partitions))
            write_docs(node.url, {f"late-{i}": b"x" for i in range(400)})
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=chromium)
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(node.url + "/ui/")
                page.wait_for_selector("#map .cell")
                time.sleep(2.5)  # a couple of live updates
                for name in ("overview", "partitions", "streams", "events"):
                    page.evaluate(f"() => {{ location.hash = '#{name}'; }}")
                    page.wait_for_selector(f"#page-{name}:not([hidden])")
                    if name == "partitions":
                        page.click("#partitions-table > tbody > tr:nth-child(2) details summary")
                    page.wait_for_timeout(600)
                    path = args.out / f"{name}.png"
                    page.screenshot(path=str(path))
                    print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
                browser.close()
            for stream in streams:
                loop.run_until_complete(stream.close())
        finally:
            loop.close()
            node.kill()
        if not args.no_cluster:
            cluster_shots(args.out, chromium, work)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
