"""A real coordinator process and simulated agent hosts for the service benchmarks.

``Coordinator`` runs ``python -m coordinator serve`` on a SQLite file in a temporary directory.
A ``SimHost`` carries several ranks of one group the way a real agent host would: it joins them,
reports all links up, heartbeats them in one batch, long-polls the group's updates for its first
rank (``view_prepare`` and ``view_committed`` go to every rank), and ACKs a prepare for all its
participating ranks in one request.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

from agent.httplite import Connection
from coordinator.cli import serve_argv

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Coordinator:
    def __init__(self, *args: str) -> None:
        self.dir = tempfile.TemporaryDirectory(prefix="foldplane-bench-")
        self.db = Path(self.dir.name) / "log.db"
        self.port = free_port()
        self.args = args
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120.0) -> Coordinator:
        self.process = subprocess.Popen(
            serve_argv(
                str(self.db), self.port, "--store-port", "-1", "--log-level", "warning", *self.args
            ),
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "FOLDPLANE_TOKEN": "", "FOLDPLANE_SECRET": ""},
        )
        deadline = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return self
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the coordinator did not start") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.dir.cleanup()

    async def connect(self) -> Connection:
        return await Connection("127.0.0.1", self.port).open()


class SimHost:
    def __init__(
        self, coordinator: Coordinator, group: str, ranks: list[int], world_size: int
    ) -> None:
        self.coordinator = coordinator
        self.group = group
        self.ranks = ranks
        self.world_size = world_size
        self.incarnation = {r: uuid.uuid4().hex for r in ranks}
        self.committed: dict[int, asyncio.Event] = {}
        self.version = 0
        self.conn: Connection | None = None
        self._poll: Connection | None = None
        self._ack: Connection | None = None
        self._task: asyncio.Task[None] | None = None
        # encoded once: the same batch is sent thousands of times
        self.heartbeat_body = msgspec.json.encode(
            {
                "events": [
                    {"type": "heartbeat", "group": group, "rank": r, "incarnation": inc}
                    for r, inc in self.incarnation.items()
                ]
            }
        )

    async def start(self) -> None:
        self.conn = await self.coordinator.connect()
        self._poll = await self.coordinator.connect()
        self._ack = await self.coordinator.connect()
        await self.events([self._event("join", r) for r in self.ranks])
        peers = {r: {str(p): "up" for p in range(self.world_size) if p != r} for r in self.ranks}
        await self.events(
            [self._event("links", r, peers=peers[r], self_ready=True) for r in self.ranks]
        )
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for conn in (self.conn, self._poll, self._ack):
            if conn is not None:
                await conn.close()

    def _event(self, type_: str, rank: int, **fields: Any) -> dict[str, Any]:
        return {
            "type": type_,
            "group": self.group,
            "rank": rank,
            "incarnation": self.incarnation[rank],
            **fields,
        }

    async def events(
        self, events: list[dict[str, Any]], conn: Connection | None = None
    ) -> list[dict]:
        status, body = await (conn or self.conn).request(
            "POST", "/agents/events", {"events": events}
        )
        if status != 200:
            raise RuntimeError(f"POST /agents/events answered {status}: {body}")
        return body["results"]

    async def heartbeat(self) -> list[dict]:
        status, body = await self.conn.request("POST", "/agents/events", self.heartbeat_body)
        if status != 200:
            raise RuntimeError(f"heartbeat answered {status}: {body}")
        return body["results"]

    def wait_version(self, version: int) -> asyncio.Event:
        return self.committed.setdefault(version, asyncio.Event())

    async def _follow(self) -> None:
        after = 0
        rank = self.ranks[0]
        while True:
            status, body = await self._poll.request(
                "GET", f"/agents/updates?group={self.group}&rank={rank}&after={after}&timeout=30"
            )
            if status != 200:
                raise RuntimeError(f"updates answered {status}: {body}")
            for update in body["updates"]:
                if update["type"] == "view_prepare":
                    mine = [r for r in self.ranks if r in set(update["participants"])]
                    if mine:
                        await self.events(
                            [self._event("ack", r, version=update["version"]) for r in mine],
                            self._ack,
                        )
                elif update["type"] == "view_committed":
                    self.version = max(self.version, update["version"])
                    self.wait_version(update["version"]).set()
            after = body["next_after"]


async def form_group(
    coordinator: Coordinator, group: str, world_size: int, *, per_host: int = 8, **config: Any
) -> list[SimHost]:
    """Create ``group``, start its simulated hosts and wait for view 1."""
    conn = await coordinator.connect()
    try:
        status, body = await conn.request(
            "POST", "/groups", {"group": group, "world_size": world_size, **config}
        )
        if status not in (200, 201):
            raise RuntimeError(f"POST /groups answered {status}: {body}")
    finally:
        await conn.close()
    hosts = [
        SimHost(coordinator, group, list(range(i, min(i + per_host, world_size))), world_size)
        for i in range(0, world_size, per_host)
    ]
    formed = [h.wait_version(1) for h in hosts]
    await asyncio.gather(*(h.start() for h in hosts))
    await asyncio.wait_for(asyncio.gather(*(e.wait() for e in formed)), 120)
    return hosts
