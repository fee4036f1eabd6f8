"""A tiny driver for the fold: records at chosen times in, effects out. No clock, no sleep."""

from __future__ import annotations

from typing import Any

import msgspec

from foldplane.coordinator.fold.effects import Effect, ViewCommitted, ViewPrepare
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.eventlog.record import Record

S = 1_000_000_000
T0 = 1_700_000_000 * S


class Script:
    """Feeds records to a Coordinator at times given in seconds after ``T0``."""

    def __init__(self, machine: Coordinator | None = None) -> None:
        self.m = machine or Coordinator()
        self.offset = self.m.offset
        self.now = T0
        self.records: list[Record] = []
        self.incarnations: dict[tuple[str, int], str] = {}

    def at(self, seconds: float) -> Script:
        self.now = T0 + round(seconds * S)
        return self

    def record(
        self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> list[Effect]:
        self.offset += 1
        rec = Record(
            offset=self.offset,
            ts=self.now,
            term=1,
            kind=kind,
            group=group,
            rank=rank,
            payload=payload,
            checksum=0,
        )
        self.records.append(rec)
        return self.m.step(rec)

    def create(self, group: str = "g", world_size: int = 4, **config: Any) -> list[Effect]:
        return self.record(
            "group_created", group, None, {"world_size": world_size, "config": config}
        )

    def inc(self, rank: int, group: str = "g") -> str:
        return self.incarnations.setdefault((group, rank), f"{group}-{rank}-a")

    def join(self, rank: int, incarnation: str | None = None, group: str = "g") -> list[Effect]:
        if incarnation is not None:
            self.incarnations[(group, rank)] = incarnation
        return self.record("join", group, rank, {"incarnation": self.inc(rank, group)})

    def beat(self, rank: int, group: str = "g", incarnation: str | None = None) -> list[Effect]:
        return self.record(
            "heartbeat", group, rank, {"incarnation": incarnation or self.inc(rank, group)}
        )

    def links(
        self,
        rank: int,
        down: tuple[int, ...] = (),
        ready: bool = True,
        hint: list[int] | None = None,
        group: str = "g",
    ) -> list[Effect]:
        payload: dict[str, Any] = {
            "incarnation": self.inc(rank, group),
            "peers": {str(p): "down" for p in down},
            "self_ready": ready,
        }
        if hint is not None:
            payload["failed_ranks_hint"] = hint
        return self.record("links", group, rank, payload)

    def ack(self, rank: int, version: int, group: str = "g") -> list[Effect]:
        return self.record(
            "ack", group, rank, {"incarnation": self.inc(rank, group), "version": version}
        )

    def exit(self, rank: int, group: str = "g") -> list[Effect]:
        return self.record("exit", group, rank, {"incarnation": self.inc(rank, group)})

    def death(self, rank: int, group: str = "g", **payload: Any) -> list[Effect]:
        return self.record("death_reported", group, rank, payload)

    def propose(self, op: str, ranks: list[int], group: str = "g", **extra: Any) -> list[Effect]:
        return self.record("proposal", group, None, {"op": op, "ranks": ranks, **extra})

    def tick(self) -> list[Effect]:
        return self.record("tick", None, None, {})

    def ack_all(self, group: str = "g") -> list[Effect]:
        """Every outstanding participant ACKs the version in flight."""
        status = self.m.group_status(group)
        change = status["change_in_flight"]
        out: list[Effect] = []
        for r in change["participants"]:
            if r not in change["acked"] + change["dropped"] + change["exited"]:
                out += self.ack(r, change["version"], group)
        return out

    def form(self, group: str = "g", world_size: int = 4, **config: Any) -> list[Effect]:
        """Create a group, join and ready every rank, ACK view 1."""
        out = self.create(group, world_size, **config)
        for r in range(world_size):
            out += self.join(r, group=group)
        for r in range(world_size):
            out += self.links(r, group=group)
        out += self.ack_all(group)
        return out


def of(effects: list[Effect], cls: type) -> list[Any]:
    return [e for e in effects if isinstance(e, cls)]


def one(effects: list[Effect], cls: type) -> Any:
    found = of(effects, cls)
    assert len(found) == 1, f"expected one {cls.__name__}, got {found}"
    return found[0]


def encode(effects: list[Effect]) -> bytes:
    return msgspec.json.encode(effects)


__all__ = ["S", "T0", "Script", "ViewCommitted", "ViewPrepare", "encode", "of", "one"]
