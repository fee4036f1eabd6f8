"""Fixtures of the service suites: a real ``python -m coordinator serve`` on a SQLite file.

``Server`` is a real uvicorn process on 127.0.0.1 at a free port. Tests talk to it with httpx
and the simulated agent hosts of ``agent.simhost``, which run the real ``AgentMachine`` for each
rank over the real wire.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from foldplane.api.app import create_app
from foldplane.coordinator.commands import serve_argv
from foldplane.coordinator.host.loop import Host
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]

#: Group settings for the scenarios: failures show within a couple of seconds, yet a loaded
#: machine does not trip them by accident.
FAST = {
    "heartbeat_timeout_s": 2.0,
    "ack_timeout_s": 2.0,
    "admission_timeout_s": 5.0,
    "formation_timeout_s": 30.0,
    "reconcile_window_s": 0.05,
}


@dataclass
class Server:
    db: Path
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, *, wait: bool = True) -> Server:
        env = {**os.environ, **self.env}
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                serve_argv(str(self.db), self.port, "--log-level", "warning", *self.args),
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"the coordinator exited with {self.process.returncode}:\n{self.output()}"
                )
            try:
                if httpx.get(self.url + "/healthz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"the coordinator did not come up:\n{self.output()}")
            # A real server in another process: its port answering is the readiness, and it
            # announces none we can wait on (it runs at --log-level warning), so this looks
            # every 50 ms, until it exits or ``timeout``.
            time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL: no shutdown path runs, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def stop(self) -> int:
        """SIGTERM and wait: the graceful path (final snapshot)."""
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def replay(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "replay", str(db), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def make_server(tmp: Path, *, store: bool = False, **kw) -> Server:
    """A server on ``tmp/log.db``; without ``store`` it skips the rendezvous store (and the
    seconds that importing torch takes), which only the data plane needs."""
    args = kw.pop("args", [])
    if not store:
        args = ["--store-port", "-1", *args]
    return Server(db=tmp / "log.db", port=free_port(), log_path=tmp / "server.log", args=args, **kw)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = make_server(tmp_path).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for a module whose tests each use their own group (saves start-ups)."""
    srv = make_server(tmp_path_factory.mktemp("shared"), store=True).start()
    yield srv
    srv.stop()


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[Host]:
    """A real Host on a SQLite file in ``tmp_path``, beats appended at once (no flush wait)."""
    h = await Host.open(str(tmp_path / "log.db"), heartbeat_flush_s=0)
    try:
        yield h
    finally:
        await h.close()


def asgi_client(host: Host) -> httpx.AsyncClient:
    """An HTTP client of the real app over ``host``, in process (no socket)."""
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=create_app(host)), base_url="http://t"
    )
