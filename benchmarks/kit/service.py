"""A real coordinator process for a benchmark, and launchers for workers on it.

:class:`Service` runs ``python -m coordinator serve`` (the command line of
``coordinator.commands.serve_argv``) on 127.0.0.1 on a free port, its log a SQLite file in a
temporary directory of its own, or any log URL (a PostgreSQL schema for the failover
benchmark). What the process prints goes to ``coordinator.log`` there and what its workers
print on stderr to ``workers.log``: a failed run shows their tails (:meth:`Service.tails`).
It can be stopped by any signal and started again on the same port, so a client's address list
still holds.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from ...coordinator.commands import serve_argv

ROOT = Path(__file__).resolve().parents[2]
#: The environment of the coordinator and of its workers: no authentication on loopback.
NO_AUTH = {"FOLDPLANE_TOKEN": "", "FOLDPLANE_SECRET": ""}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """One coordinator process (see the module docstring).

    ``options`` are more ``serve`` options; ``store=True`` also runs the rendezvous store that
    torch workers' groups form on (simulated agents need none); ``db`` is the log (default: a
    SQLite file in the service's directory). A context manager: :meth:`close` on exit.
    """

    def __init__(
        self, *options: str, db: str | None = None, store: bool = False, name: str = "bench"
    ) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix=f"foldplane-bench-{name}-")
        self.dir = Path(self._dir.name)
        self.db = db if db is not None else str(self.dir / "log.db")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.options = ("--store-port", "0" if store else "-1", "--log-level", "warning", *options)
        self.process: subprocess.Popen[bytes] | None = None
        self.workers_log = open(self.dir / "workers.log", "ab")  # noqa: SIM115 (closed in close)
        self._client: Any = None
        self._groups = 0

    # -- the process -----------------------------------------------------------------------------

    def start(self, *, wait: bool = True, timeout: float = 120.0) -> Service:
        """Start the process; with ``wait``, return once it answers ``/healthz``."""
        with open(self.dir / "coordinator.log", "ab") as out:
            self.process = subprocess.Popen(
                serve_argv(self.db, self.port, *self.options),
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, **NO_AUTH},
            )
        if wait:
            self.wait_ready(timeout)
        return self

    def wait_ready(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.health() is None:
            assert self.process is not None
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the coordinator on port {self.port} did not start:\n{self.tails()}"
                )
            time.sleep(0.05)

    def health(self) -> dict[str, Any] | None:
        """``GET /healthz``, or None while nothing answers."""
        try:
            return httpx.get(self.url + "/healthz", timeout=1.0).json()
        except (httpx.HTTPError, ValueError):
            return None

    def role(self) -> str | None:
        """``leader`` or ``standby`` (or None while nothing answers)."""
        health = self.health()
        return None if health is None else health.get("role")

    def wait_role(self, role: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.role() != role:
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out after {timeout} s waiting for {self.url} as {role}")
            time.sleep(0.01)

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the process; a SIGKILL is reaped before this returns."""
        assert self.process is not None
        self.process.send_signal(sig)
        if sig == signal.SIGKILL:
            self.process.wait()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def cpu_s(self) -> float:
        """The process's CPU seconds so far (user + system, in clock ticks)."""
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        """SIGTERM (a stopped process is continued first); SIGKILL after 30 s."""
        if self.process is None or self.process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGCONT)
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def close(self) -> None:
        self.stop()
        self.workers_log.close()
        if self._client is not None:
            self._client.close()
        self._dir.cleanup()

    def __enter__(self) -> Service:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def tail(self, name: str, size: int = 3000) -> str:
        path = self.dir / name
        return path.read_bytes()[-size:].decode(errors="replace") if path.exists() else ""

    def tails(self) -> str:
        """The ends of ``coordinator.log`` and ``workers.log``, for a failure's report."""
        return "\n".join(
            f"{name} ends with:\n{self.tail(name)}" for name in ("coordinator.log", "workers.log")
        )

    # -- clients and workers ---------------------------------------------------------------------

    @property
    def client(self) -> Any:
        """An ``agent.client.CoordinatorClient`` of this service (made on first use)."""
        if self._client is None:
            from ...agent.client import CoordinatorClient

            self._client = CoordinatorClient(self.url, timeout_s=30.0)
        return self._client

    async def connect(self) -> Any:
        """A keep-alive ``agent.httplite.Connection`` to the service, for async load."""
        from ...agent.httplite import Connection

        return await Connection("127.0.0.1", self.port).open()

    def next_name(self, prefix: str) -> str:
        """``<prefix><n>``, n counting the names this service gave: a fresh group's name."""
        self._groups += 1
        return f"{prefix}{self._groups}"

    def create_group(self, group: str, world: int, **config: Any) -> None:
        """``POST /groups`` (formation bound 300 s unless ``config`` says otherwise)."""
        self.client.create_group(group, world, **{"formation_timeout_s": 300.0, **config})

    def new_group(self, prefix: str, world: int, **config: Any) -> str:
        """Create a fresh group (:meth:`next_name`) of ``world`` ranks; its name."""
        group = self.next_name(prefix)
        self.create_group(group, world, **config)
        return group

    def launch(
        self,
        command: Sequence[str],
        group: str,
        ranks: Sequence[int],
        on_spawn: Any,
        env: dict[str, str] | None = None,
        **options: Any,
    ) -> Any:
        """Start an ``agent.launch.Launcher`` of ``command`` for ``ranks`` of ``group``: the
        workers' stdout piped to ``on_spawn`` (a :class:`~benchmarks.kit.workers.Lines`'s
        ``follow``), their stderr to ``workers.log``; ``options`` are the launcher's."""
        from ...agent.launch import Launcher

        return Launcher(
            list(command),
            coordinator=self.url,
            group=group,
            ranks=ranks,
            stdout=subprocess.PIPE,
            stderr=self.workers_log,
            on_spawn=on_spawn,
            env={**os.environ, **NO_AUTH, **(env or {})},
            **options,
        ).start()
