"""Local servers that integration tests start and stop themselves: `mlflow server` on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from specray.cluster.loopback import free_ports
from tests.stores import new_store

BIN = Path(sys.executable).parent
# no phoning home from the server or the clients (the test machine may be offline)
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"}


def free_port() -> int:
    return free_ports(1)[0]


@dataclass
class MlflowServer:
    """`mlflow server` on a loopback port with a sqlite backend and artifacts proxied to `folder`."""

    folder: Path
    port: int
    process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 600.0) -> MlflowServer:  # only a broken start takes this long
        command = [
            str(BIN / "mlflow"),
            "server",
            "--host=127.0.0.1",
            f"--port={self.port}",
            f"--backend-store-uri={new_store(self.folder)}",
            f"--artifacts-destination={self.folder / 'artifacts'}",  # uploads go through the server
            "--workers=1",
        ]
        log = self.folder / "server.log"
        with log.open("a") as out:
            self.process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **QUIET},
            )
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self
            except OSError:  # not listening yet
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                pytest.fail(f"mlflow server did not come up at {self.url}:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Stop the server's whole process group (its uvicorn workers are in it)."""
        if self.process is None or self.process.poll() is not None:
            return
        os.killpg(self.process.pid, sig)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()


def mlflow_server(folder: Path) -> MlflowServer:
    folder.mkdir(parents=True, exist_ok=True)
    return MlflowServer(folder, free_port()).start()


def listening_addresses(port: int) -> set[str]:
    """The local addresses that TCP sockets in LISTEN state on `port` are bound to (IPv4 and IPv6)."""
    import ipaddress

    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].split(":")
            if fields[3] != "0A" or int(hex_port, 16) != port:  # 0A = LISTEN
                continue
            raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
            words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.add(str(ipaddress.ip_address(words)))
    return found
