"""A group's life written by the real in-process ``Host`` on a real log.

The life: formation of 4 ranks, heartbeats and all-up links reports, a tick, a deactivation
and an activation through the barrier, a links report with down evidence (auto-deactivation
through the barrier), then more heartbeats. The deadlines are an hour long, so no timer fires
on its own. ``form`` and ``view_changes`` are its parts for a life of many view changes.
"""

from __future__ import annotations

import uuid

from foldplane.coordinator.host.loop import Appended, Host
from foldplane.eventlog import NewRecord


class Life:
    def __init__(self, host: Host, group: str = "train", world_size: int = 4) -> None:
        self.host = host
        self.group = group
        self.n = world_size
        self.inc = {r: uuid.uuid4().hex for r in range(world_size)}

    async def beats(self, rounds: int, ranks: list[int] | None = None) -> None:
        for _ in range(rounds):
            batch = [
                NewRecord(
                    kind="heartbeat",
                    group=self.group,
                    rank=r,
                    payload={"incarnation": self.inc[r]},
                )
                for r in (ranks if ranks is not None else range(self.n))
            ]
            outcomes = await self.host.submit_many(batch)
            assert all(isinstance(o, Appended) for o in outcomes), outcomes

    def links(self, rank: int, down: tuple[int, ...] = ()) -> NewRecord:
        peers = {str(p): ("down" if p in down else "up") for p in range(self.n) if p != rank}
        return NewRecord(
            kind="links",
            group=self.group,
            rank=rank,
            payload={"incarnation": self.inc[rank], "peers": peers, "self_ready": True},
        )

    async def ack_in_flight(self) -> None:
        status = self.host.machine.group_status(self.group)
        change = status["change_in_flight"]
        assert change is not None, status
        acks = [
            NewRecord(
                kind="ack",
                group=self.group,
                rank=r,
                payload={"incarnation": self.inc[r], "version": change["version"]},
            )
            for r in change["participants"]
            if r not in change["acked"] + change["dropped"] + change["exited"]
        ]
        assert all(isinstance(o, Appended) for o in await self.host.submit_many(acks))

    def version(self) -> int:
        view = self.host.machine.current_view(self.group)
        return 0 if view is None else view.version

    async def form(self) -> None:
        """Create the group, join and ready every rank, ACK view 1."""
        g, host = self.group, self.host
        config = {"heartbeat_timeout_s": 3600.0, "ack_timeout_s": 3600.0, "reconcile_window_s": 0}
        created = await host.submit(
            NewRecord(
                kind="group_created", group=g, payload={"world_size": self.n, "config": config}
            )
        )
        assert isinstance(created, Appended)
        joins = [
            NewRecord(kind="join", group=g, rank=r, payload={"incarnation": self.inc[r]})
            for r in range(self.n)
        ]
        assert all(isinstance(o, Appended) for o in await host.submit_many(joins))
        assert all(
            isinstance(o, Appended)
            for o in await host.submit_many([self.links(r) for r in range(self.n)])
        )
        await self.ack_in_flight()
        assert self.version() == 1

    async def view_changes(self, n: int) -> None:
        """``n`` view changes through the barrier: rank ``1 + i % (world_size - 1)``
        deactivated, then activated again, and so on; a heartbeat round after each."""
        for i in range(n):
            rank = 1 + (i // 2) % (self.n - 1)
            op = "deactivate" if i % 2 == 0 else "activate"
            before = self.version()
            proposed = await self.host.submit(
                NewRecord(kind="proposal", group=self.group, payload={"op": op, "ranks": [rank]})
            )
            assert isinstance(proposed, Appended)
            await self.ack_in_flight()
            assert self.version() == before + 1
            await self.beats(1)

    async def live(self) -> None:
        """The whole life; every step asserts that it did what the script says."""
        g, host = self.group, self.host
        await self.form()
        await self.beats(40)
        # all-up reports again: they change nothing (removable)
        await host.submit_many([self.links(r) for r in range(self.n)])
        await host.submit(NewRecord(kind="tick", payload={}))
        for op in ("deactivate", "activate"):
            proposed = await host.submit(
                NewRecord(kind="proposal", group=g, payload={"op": op, "ranks": [3]})
            )
            assert isinstance(proposed, Appended)
            await self.ack_in_flight()
            await self.beats(30)
        assert self.version() == 3
        # rank 0 reports rank 2 down: auto-deactivation through the barrier
        await host.submit(self.links(0, down=(2,)))
        await self.ack_in_flight()
        assert self.version() == 4
        await self.beats(60, ranks=[0, 1, 3])
