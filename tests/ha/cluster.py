"""Real coordinator processes on one PostgreSQL schema: start, kill, freeze, resume, ask.

Each :class:`Node` is a ``python -m coordinator serve --db postgresql://...?schema=S`` process
on 127.0.0.1 at a free port, without a rendezvous store (no torch import). Every schema is
fresh and dropped afterwards, so the suite runs beside others on the same database.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from foldplane.agent.client import CoordinatorUnavailable
from foldplane.coordinator.commands import serve_argv
from tests.conftest import PG_URL, free_port

ROOT = Path(__file__).resolve().parents[2]

#: Lease settings the suite runs with: the defaults of ``serve``.
LEASE_S = 1.0
POLL_S = 0.1


def schema_url(schema: str) -> str:
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"


def new_schema() -> str:
    return f"ha_test_{uuid.uuid4().hex[:12]}"


async def drop_schema(schema: str) -> None:
    conn = await asyncpg.connect(PG_URL)
    try:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    finally:
        await conn.close()


async def fetch(schema: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    """Read the schema's tables directly (the ground truth, not any coordinator's answer)."""
    conn = await asyncpg.connect(PG_URL, server_settings={"search_path": schema})
    try:
        return await conn.fetch(sql, *args)
    finally:
        await conn.close()


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, step: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns something truthy; fail naming ``what`` at the deadline.

    The predicates read real coordinator processes (a role, a health answer, the acknowledged
    heartbeats of real agents) that change in their own time and announce it to nobody: the
    poll paces that observation, bounded by ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


@dataclass
class Node:
    """One coordinator process."""

    schema: str
    log_path: Path
    port: int = field(default_factory=free_port)
    args: list[str] = field(default_factory=list)
    #: more environment for the process (the failover tests' stop points)
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Node:
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                serve_argv(
                    schema_url(self.schema),
                    self.port,
                    "--store-port",
                    "-1",
                    "--lease-s",
                    str(LEASE_S),
                    "--lease-poll-s",
                    str(POLL_S),
                    "--log-level",
                    "info",
                    *self.args,
                ),
                cwd=ROOT,
                env={**os.environ, "FOLDPLANE_TOKEN": "", "FOLDPLANE_SECRET": "", **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        return self

    def health(self, timeout: float = 2.0) -> dict[str, Any] | None:
        """``/healthz`` as JSON, or None when the process does not answer."""
        try:
            r = httpx.get(self.url + "/healthz", timeout=timeout)
        except httpx.HTTPError:
            return None
        return r.json()

    def role(self) -> str | None:
        h = self.health()
        return None if h is None else h.get("role")

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            assert self.process is not None
            if self.process.poll() is not None:
                raise AssertionError(
                    f"coordinator {self.url} exited with {self.process.returncode}:\n"
                    + self.output()
                )
            h = self.health()
            return h if h is not None and h.get("status") == "ok" else None

        return wait_for(ready, timeout, f"{self.url} to answer /healthz")

    def wait_role(self, role: str, timeout: float = 30.0) -> dict[str, Any]:
        return wait_for(
            lambda: (h := self.health()) is not None and h.get("role") == role and h,
            timeout,
            f"{self.url} to become {role}",
        )

    def kill(self) -> None:
        """SIGKILL: nothing of the shutdown path runs, as in a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()

    def freeze(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def stopped(self) -> bool:
        """Whether the process is stopped (by a signal, or by itself at a stop point)."""
        assert self.process is not None
        try:
            stat = Path(f"/proc/{self.process.pid}/stat").read_text()
        except FileNotFoundError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")

    def resume(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGCONT)
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.kill()

    def terms_led(self) -> list[int]:
        """Every term this node took, from its log ("leading at term N")."""
        return [int(t) for t in re.findall(r"leading at term (\d+)", self.output())]

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def get(self, path: str, **params: Any) -> dict[str, Any]:
        r = httpx.get(self.url + path, params=params, timeout=10.0)
        r.raise_for_status()
        return r.json()

    def events(self) -> list[dict[str, Any]]:
        """The whole log as this node serves it (``GET /events``, every page)."""
        out: list[dict[str, Any]] = []
        after = 0
        while True:
            page = self.get("/events", after=after, limit=1000)
            out.extend(page["events"])
            if not page["events"]:
                return out
            after = page["next_after"]

    def views(self, group: str) -> list[dict[str, Any]]:
        return self.get("/views/history", group=group, limit=1000)["views"]


def retrying(call: Callable[[], Any], timeout: float = 30.0) -> Any:
    """An operator call that retries while no coordinator answers (a leadership change)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except CoordinatorUnavailable:
            if time.monotonic() > deadline:
                raise
            # The election runs in other processes, through PostgreSQL: no event reaches us
            # when a leader is in place, so the call goes again every 50 ms until ``timeout``.
            time.sleep(0.05)


def replay(schema: str) -> subprocess.CompletedProcess[str]:
    """``python -m coordinator replay``: a fold from scratch checked against the projections."""
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "replay", schema_url(schema)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
