"""The fold's internal state: one :class:`GroupState` per group, and its JSON snapshot.

These are mutable on purpose (the fold mutates in place, h11-style, so a heartbeat costs a few
dict operations); nothing outside ``coordinator`` sees them — queries return the frozen values
of :mod:`coordinator.fold.effects` or plain data.

Derived indexes (``candidates``, ``reporters``) are rebuilt on restore rather than stored, so a
snapshot cannot disagree with itself.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Any

import msgspec

from ...eventlog.record import Record
from .config import GroupConfig, Resolved
from .effects import OFFLINE, RankState, View
from .stalls import Stall

FORMING = "forming"
FORMED = "formed"
FAILED = "failed"
#: the ``ended`` reason of a run that finished: formed, and every rank that joined exited cleanly
FINISHED = "finished: every rank exited cleanly"


class RankInfo:
    """What the fold knows about one rank and its current incarnation."""

    __slots__ = (
        "state",
        "incarnation",
        "rank_epoch",
        "last_heartbeat_ts",
        "exited",
        "self_ready",
        "down",
        "failure_counted",
        "host",
        "pid",
        "joined_version",
    )

    def __init__(self) -> None:
        self.state: str = OFFLINE
        self.incarnation: str | None = None
        self.rank_epoch = 0
        #: last sign of life as of going OFFLINE; while online, ``GroupState.alive`` has it
        self.last_heartbeat_ts: int | None = None
        self.exited = False
        #: the latest links report of this incarnation said its data plane is ready
        self.self_ready = False
        #: peers this incarnation's latest links report (or failure hint) says are down
        self.down: frozenset[int] = frozenset()
        #: this incarnation already counts against max_failure (counted once per incarnation)
        self.failure_counted = False
        self.host: str | None = None
        self.pid: int | None = None
        #: the group's committed version when this incarnation joined: a links report about
        #: that view or an older one describes an earlier process of this rank, not this one
        self.joined_version = 0

    def to_list(self) -> list[Any]:
        return [
            self.state,
            self.incarnation,
            self.rank_epoch,
            self.last_heartbeat_ts,
            self.exited,
            self.self_ready,
            sorted(self.down),
            self.failure_counted,
            self.host,
            self.pid,
            self.joined_version,
        ]

    @classmethod
    def from_list(cls, data: list[Any]) -> RankInfo:
        """From :meth:`to_list`; a snapshot of format 1 or 2 has no ``joined_version`` (0: every
        report about such an incarnation counts, as those formats' rules did)."""
        info = cls()
        if len(data) == 10:
            data = [*data, 0]
        (
            info.state,
            info.incarnation,
            info.rank_epoch,
            info.last_heartbeat_ts,
            info.exited,
            info.self_ready,
            down,
            info.failure_counted,
            info.host,
            info.pid,
            info.joined_version,
        ) = data
        info.down = frozenset(down)
        return info


class Change:
    """The one view change in flight: prepared, waiting for its participants' ACKs."""

    __slots__ = (
        "version",
        "active",
        "participants",
        "members",
        "waiting",
        "acked",
        "dropped",
        "exited",
        "ack_deadline",
        "kind",
        "proposals",
        "detail",
        "extra",
    )

    def __init__(
        self,
        version: int,
        active: tuple[int, ...],
        participants: tuple[int, ...],
        ack_deadline: int,
        kind: str,
        proposals: list[int],
        detail: str,
        extra: dict[str, Any] | None = None,
    ) -> None:
        self.version = version
        self.active = active
        self.participants = participants
        self.members = frozenset(participants)
        #: participants whose ACK is still awaited (neither ACKed nor dropped)
        self.waiting: set[int] = set(participants)
        self.acked: set[int] = set()
        #: participants lost while awaited (no ACK): they leave the view as dropped ranks
        self.dropped: set[int] = set()
        #: participants that exited cleanly while awaited: they leave the view, not dropped
        self.exited: set[int] = set()
        self.ack_deadline = ack_deadline
        self.kind = kind
        self.proposals = proposals
        self.detail = detail
        #: more of the cause, for a change that carries it (a reconfigure: its uuid and order)
        self.extra = extra or {}

    def outstanding(self) -> list[int]:
        """Participants whose ACK is still awaited, in rank order."""
        return sorted(self.waiting)

    def cause(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "proposals": list(self.proposals),
            "detail": self.detail,
            **self.extra,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "active": list(self.active),
            "participants": list(self.participants),
            "acked": sorted(self.acked),
            "dropped": sorted(self.dropped),
            "exited": sorted(self.exited),
            "ack_deadline": self.ack_deadline,
            "kind": self.kind,
            "proposals": list(self.proposals),
            "detail": self.detail,
            **({"extra": self.extra} if self.extra else {}),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Change:
        change = cls(
            d["version"],
            tuple(d["active"]),
            tuple(d["participants"]),
            d["ack_deadline"],
            d["kind"],
            list(d["proposals"]),
            d["detail"],
            d.get("extra"),
        )
        change.acked = set(d["acked"])
        change.dropped = set(d["dropped"])
        change.exited = set(d.get("exited", ()))
        change.waiting -= change.acked | change.dropped | change.exited
        return change


class GroupState:
    """Everything the fold keeps for one group."""

    def __init__(
        self, name: str, config: GroupConfig, created_ts: int, created_offset: int
    ) -> None:
        self.name = name
        self.config = config
        self.cfg: Resolved = config.resolve()
        self.created_ts = created_ts
        self.created_offset = created_offset
        self.ranks = [RankInfo() for _ in range(config.world_size)]
        #: online ranks -> last sign of life, oldest first (time only moves forward, so moving a
        #: rank to the end on each heartbeat keeps the dict sorted by deadline: O(1) per beat)
        self.alive: OrderedDict[int, int] = OrderedDict()
        #: online and self-ready ranks: the vertices of the usable-edge graph
        self.candidates: set[int] = set()
        #: ranks whose latest report names at least one peer down
        self.reporters: set[int] = set()
        #: the current Healthy Set
        self.healthy: set[int] = set()
        #: the usable-edge graph changed since the Healthy Set was last computed
        self.dirty = False
        #: ranks whose candidacy changed since then, and whether the Healthy Set then held every
        #: candidate (no down edge). Not snapshotted: a restored group recomputes in full once,
        #: which gives the same set.
        self.touched: set[int] = set()
        self.healthy_is_all = False
        #: end of the open reconciliation window, if any
        self.window_end: int | None = None
        #: bumped whenever a rank input this group's state accepted may be refused now (see
        #: ``Coordinator.fence_epoch``). Not snapshotted: only the host's buffer compares it,
        #: and a restored host starts with an empty one.
        self.fence_epoch = 0
        self.formation = FORMING
        self.formation_error: str | None = None
        self.failures = 0
        #: (rank, rank_epoch) of every failed incarnation, in order
        self.failed: list[tuple[int, int]] = []
        self.shutdown: str | None = None
        #: a rank went OFFLINE or a view committed since the budget was last enforced (always
        #: False between steps, so not part of a snapshot)
        self.budget_due = False
        self.view: View | None = None
        self.change: Change | None = None
        #: pending proposals: (id, admission deadline), first in first out
        self.queue: deque[tuple[int, int]] = deque()
        #: idempotency key -> proposal id
        self.keys: dict[str, int] = {}
        #: a reconfigure's uuid -> its proposal id (``coordinator/fold/reconfigure.py``)
        self.uuids: dict[int, int] = {}
        #: the committed view failed with every member alive (``coordinator.fold.stalls``)
        self.stall: Stall | None = None
        #: why the operator ended the group's run, and the offset of that record (None: it runs)
        self.ended: str | None = None
        self.ended_offset: int | None = None
        #: ended and gone from the listings (its history stays)
        self.deleted = False
        #: the run ended because it finished (``ended`` is FINISHED), not by the operator
        self.finished = False

    @property
    def active(self) -> tuple[int, ...]:
        return self.view.active_ranks if self.view is not None else ()

    @property
    def version(self) -> int:
        return self.view.version if self.view is not None else 0

    def to_dict(self) -> dict[str, Any]:
        d = {
            "name": self.name,
            "config": self.config.to_dict(),
            "created_ts": self.created_ts,
            "created_offset": self.created_offset,
            "ranks": [info.to_list() for info in self.ranks],
            "alive": [[rank, ts] for rank, ts in self.alive.items()],
            "healthy": sorted(self.healthy),
            "dirty": self.dirty,
            "window_end": self.window_end,
            "formation": self.formation,
            "formation_error": self.formation_error,
            "failures": self.failures,
            "failed": [list(f) for f in self.failed],
            "shutdown": self.shutdown,
            "view": None if self.view is None else msgspec.to_builtins(self.view, str_keys=True),
            "change": None if self.change is None else self.change.to_dict(),
            "queue": [list(item) for item in self.queue],
            "keys": dict(sorted(self.keys.items())),
            # only once a reconfigure came, so a snapshot of any other group reads as it did
            **({"uuids": [list(item) for item in self.uuids.items()]} if self.uuids else {}),
            # only once ended, so a snapshot of a running group reads as it always did
            **(
                {}
                if self.ended is None
                else {
                    "ended": self.ended,
                    "ended_offset": self.ended_offset,
                    "deleted": self.deleted,
                    **({"finished": True} if self.finished else {}),
                }
            ),
        }
        if self.stall is not None:
            d["stall"] = self.stall.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GroupState:
        config = msgspec.convert(d["config"], GroupConfig)
        g = cls(d["name"], config, d["created_ts"], d["created_offset"])
        g.ranks = [RankInfo.from_list(item) for item in d["ranks"]]
        g.alive = OrderedDict((rank, ts) for rank, ts in d["alive"])
        g.healthy = set(d["healthy"])
        g.dirty = d["dirty"]
        g.window_end = d["window_end"]
        g.formation = d["formation"]
        g.formation_error = d["formation_error"]
        g.failures = d["failures"]
        g.failed = [(rank, epoch) for rank, epoch in d["failed"]]
        g.shutdown = d["shutdown"]
        g.view = None if d["view"] is None else msgspec.convert(d["view"], View, strict=False)
        g.change = None if d["change"] is None else Change.from_dict(d["change"])
        g.queue = deque((pid, deadline) for pid, deadline in d["queue"])
        g.keys = dict(d["keys"])
        g.uuids = {uuid: pid for uuid, pid in d.get("uuids", ())}
        stall = d.get("stall")  # absent from snapshots taken before stalls were resolved
        g.stall = None if stall is None else Stall.from_dict(stall)
        g.ended = d.get("ended")
        g.ended_offset = d.get("ended_offset")
        g.deleted = bool(d.get("deleted", False))
        g.finished = bool(d.get("finished", False))
        g.candidates = {
            r for r, info in enumerate(g.ranks) if info.state != OFFLINE and info.self_ready
        }
        g.reporters = {r for r, info in enumerate(g.ranks) if info.down}
        return g


def rank_state(
    g: GroupState,
    rank: int,
    reason: str,
    record: Record,
    *,
    cause: str | None = None,
    state: str | None = None,
) -> RankState:
    """The ``rank_state`` effect that tells of ``rank``'s state in ``g`` now (or ``state``, the
    one a decision moves it to), and why."""
    info = g.ranks[rank]
    return RankState(
        group=g.name,
        rank=rank,
        state=info.state if state is None else state,
        incarnation=info.incarnation,
        rank_epoch=info.rank_epoch,
        reason=reason,
        cause=cause,
        offset=record.offset,
    )
