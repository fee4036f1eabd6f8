"""Simulated agents that speak the wire protocol of docs/protocol.md over real HTTP.

A :class:`SimGroup` carries several ranks of one group, the way one agent host would: it joins
them, reports their links, heartbeats them in batches, and follows each rank's long-poll of
``GET /agents/updates``, ACKing every ``view_prepare`` it participates in (unless told not to,
to simulate a hung rank). It keeps what each rank saw, so tests can wait for a committed view
without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import httpx


class SimGroup:
    def __init__(
        self,
        client: httpx.AsyncClient,
        group: str,
        world_size: int,
        ranks: list[int] | None = None,
        *,
        headers: dict[str, str] | None = None,
        heartbeat_s: float = 0.25,
        rejoin: bool = False,
    ) -> None:
        self.client = client
        self.group = group
        self.world_size = world_size
        self.ranks = list(range(world_size)) if ranks is None else ranks
        self.headers = headers or {}
        self.heartbeat_s = heartbeat_s
        self.rejoin = rejoin
        self.incarnation = {r: uuid.uuid4().hex for r in self.ranks}
        self.after = {r: 0 for r in self.ranks}
        self.acking = set(self.ranks)
        self.beating = set(self.ranks)
        self.committed: dict[int, dict[str, Any]] = {}
        self.states: dict[int, str] = {}
        self.shutdowns: list[dict[str, Any]] = []
        self.ack_results: list[dict[str, Any]] = []
        #: Every (event, result) pair the server answered, when a test wants an audit trail.
        self.sent: list[tuple[dict[str, Any], dict[str, Any]]] | None = None
        self._changed = asyncio.Condition()
        self._tasks: list[asyncio.Task[None]] = []

    # -- raw protocol ----------------------------------------------------------------------------

    def event(self, type_: str, rank: int, **fields: Any) -> dict[str, Any]:
        return {
            "type": type_,
            "group": self.group,
            "rank": rank,
            "incarnation": self.incarnation[rank],
            **fields,
        }

    async def send(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        r = await self.client.post("/agents/events", json={"events": events}, headers=self.headers)
        r.raise_for_status()
        results = r.json()["results"]
        if self.sent is not None:
            self.sent.extend(zip(events, results, strict=True))
        return results

    async def join(self, ranks: list[int] | None = None) -> list[dict[str, Any]]:
        return await self.send(
            [self.event("join", r, host="sim", pid=1000 + r) for r in ranks or self.ranks]
        )

    async def links(
        self, ranks: list[int] | None = None, *, down: dict[int, list[int]] | None = None
    ) -> list[dict[str, Any]]:
        down = down or {}
        events = []
        for r in ranks or self.ranks:
            peers = {
                str(p): ("down" if p in down.get(r, []) else "up")
                for p in range(self.world_size)
                if p != r
            }
            events.append(self.event("links", r, peers=peers, self_ready=True))
        return await self.send(events)

    async def heartbeat(self, ranks: list[int] | None = None) -> list[dict[str, Any]]:
        return await self.send([self.event("heartbeat", r) for r in ranks or self.ranks])

    async def poll(self, rank: int, timeout: float = 5.0) -> dict[str, Any]:
        r = await self.client.get(
            "/agents/updates",
            params={
                "group": self.group,
                "rank": rank,
                "after": self.after[rank],
                "timeout": timeout,
            },
            headers=self.headers,
            timeout=timeout + 10,
        )
        r.raise_for_status()
        return r.json()

    # -- following -------------------------------------------------------------------------------

    async def start(self) -> None:
        """Join, report links, then heartbeat and follow every rank in the background."""
        await self.join()
        await self.links()
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._follow(r)) for r in self.ranks]
        self._tasks.append(loop.create_task(self._beat()))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task
        self._tasks = []

    async def _beat(self) -> None:
        """Heartbeat; a rank the coordinator holds OFFLINE (say after a coordinator restart
        took longer than the heartbeat timeout) joins again, as a real agent does."""
        while True:
            await asyncio.sleep(self.heartbeat_s)
            if not self.beating:
                continue
            ranks = sorted(self.beating)
            with contextlib.suppress(httpx.HTTPError):
                results = await self.heartbeat(ranks)
                lost = [
                    r
                    for r, res in zip(ranks, results, strict=True)
                    if res.get("error") == "rank_offline"
                ]
                if lost and self.rejoin:
                    await self.join(lost)
                    await self.links(lost)

    async def _follow(self, rank: int) -> None:
        while True:
            try:
                answer = await self.poll(rank)
                for update in answer["updates"]:
                    await self._on_update(rank, update)
            except httpx.HTTPError:  # the server is down or restarting: try again soon
                await asyncio.sleep(0.1)
                continue
            self.after[rank] = answer["next_after"]
            async with self._changed:
                self._changed.notify_all()

    async def _on_update(self, rank: int, update: dict[str, Any]) -> None:
        kind = update["type"]
        if kind == "view_prepare" and rank in update["participants"] and rank in self.acking:
            results = await self.send([self.event("ack", rank, version=update["version"])])
            self.ack_results.extend(results)
        elif kind == "view_committed":
            self.committed[update["version"]] = update
        elif kind == "rank_state" and update["rank"] == rank:
            self.states[rank] = update["state"]
        elif kind == "shutdown_with_save":
            self.shutdowns.append(update)

    async def wait_until(self, predicate, timeout: float = 20.0) -> None:
        """Wait (woken by each long-poll answer, never by sleeping) until ``predicate()``."""
        async with asyncio.timeout(timeout):
            async with self._changed:
                await self._changed.wait_for(predicate)

    async def wait_version(self, version: int, timeout: float = 20.0) -> dict[str, Any]:
        await self.wait_until(lambda: version in self.committed, timeout)
        return self.committed[version]

    @property
    def version(self) -> int:
        return max(self.committed, default=0)
