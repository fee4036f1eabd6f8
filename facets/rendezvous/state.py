"""The rendezvous facet's state in the fold: each job, the nodes waiting for its next round, its
latest round and how a job reads as plain data (``job_status``, which the routes and the story
show). The rules that change it are ``fold.py``'s."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .effects import (
    RoundNode,
)
from .inputs import SETTINGS

_NS = 1_000_000_000


def _ns(seconds: float) -> int:
    return round(seconds * _NS)


@dataclass
class Waiting:
    """A node waiting for the next round: what it offered (its store) and said (its cause)."""

    node: str
    attempt: str
    host: str
    store_port: int
    local_world_size: int
    cause: str
    restart_count: int
    offset: int
    joined_ts: int
    join_deadline: int

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Job:
    """One job's rendezvous (see the module docstring)."""

    job: str
    min_nodes: int
    max_nodes: int
    last_call_s: float
    join_timeout_s: float
    keepalive_timeout_s: float
    created_offset: int
    #: the latest round formed (0: none yet), its nodes in rank order and when it formed
    round: int = 0
    members: tuple[RoundNode, ...] = ()
    formed_ts: int = 0
    #: the nodes waiting for the next round, in the order they joined
    pending: dict[str, Waiting] = field(default_factory=dict)
    #: when the last call of the round being gathered ends (rule 3c), or None
    last_call: int | None = None
    #: every node of the job (waiting or a live member) and its last keep-alive, oldest first
    alive: dict[str, int] = field(default_factory=dict)
    #: each node's latest join: (attempt, offset)
    attempts: dict[str, tuple[str, int]] = field(default_factory=dict)
    #: nodes that left, and why (the latest :data:`LEFT_KEPT`)
    left: dict[str, str] = field(default_factory=dict)
    #: who closed the job, why, and the offset
    closed: dict[str, Any] | None = None
    #: the offset of the last record that changed what a node waits on (long polls wait past it)
    version: int = 0
    #: node events (joins and leaves) so far: the next one's ``seq`` is this plus one
    node_events: int = 0

    @property
    def last_call_ns(self) -> int:
        return _ns(self.last_call_s)

    @property
    def join_timeout_ns(self) -> int:
        return _ns(self.join_timeout_s)

    @property
    def keepalive_ns(self) -> int:
        return _ns(self.keepalive_timeout_s)

    def settings(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SETTINGS}

    def live_members(self) -> list[str]:
        """The nodes of the latest round that are still part of the job, in rank order."""
        return [m.node for m in self.members if m.node in self.alive]

    def running(self) -> list[str]:
        """Live members that have not left the round (not waiting again): rule 3 waits on them."""
        return [n for n in self.live_members() if n not in self.pending]

    def nodes_waiting(self) -> int:
        """Rule 5: what a member's ``num_nodes_waiting()`` answers."""
        if self.closed is not None or not self.pending:
            return 0
        members = {m.node for m in self.members}
        if len(self.members) < self.max_nodes or any(n in members for n in self.pending):
            return len(self.pending)
        return 0

    def to_dict(self) -> dict[str, Any]:
        return {
            **{k: getattr(self, k) for k in ("job", *SETTINGS, "created_offset", "round")},
            "members": [_round_node_dict(m) for m in self.members],
            "formed_ts": self.formed_ts,
            "waiting": [w.to_dict() for w in self.pending.values()],
            "last_call": self.last_call,
            "alive": [[n, t] for n, t in self.alive.items()],
            "attempts": [[n, a, o] for n, (a, o) in self.attempts.items()],
            "left": [[n, why] for n, why in self.left.items()],
            "closed": self.closed,
            "version": self.version,
            "node_events": self.node_events,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Job:
        job = cls(**{k: d[k] for k in ("job", *SETTINGS, "created_offset", "round")})
        job.members = tuple(RoundNode(**m) for m in d["members"])
        job.formed_ts = d["formed_ts"]
        job.pending = {w["node"]: Waiting(**w) for w in d["waiting"]}
        job.last_call = d["last_call"]
        job.alive = {n: t for n, t in d["alive"]}
        job.attempts = {n: (a, o) for n, a, o in d["attempts"]}
        job.left = {n: why for n, why in d["left"]}
        job.closed = d["closed"]
        job.version = d["version"]
        job.node_events = d["node_events"]
        return job


def _round_node_dict(m: RoundNode) -> dict[str, Any]:
    return {f: getattr(m, f) for f in m.__struct_fields__}


def _world_size(nodes: Iterable[RoundNode]) -> int:
    """The workers of a round, or 0 when a node did not say how many it runs."""
    sizes = [m.local_world_size for m in nodes]
    return 0 if 0 in sizes else sum(sizes)


def job_status(job: Job) -> dict[str, Any]:
    """A job as the routes and the handler read it: its settings, its latest round (each node
    with its rank and store), who waits (and whether a last call runs), who left and why, and
    ``nodes_waiting`` (rule 5). ``version``: long polls wait past it."""
    return {
        "job": job.job,
        "settings": job.settings(),
        "round": job.round,
        "formed_ts": job.formed_ts or None,
        "nodes": [_round_node_dict(m) for m in job.members],
        "world_size": _world_size(job.members),
        "live": job.live_members(),
        "waiting": [
            {
                "node": w.node,
                "cause": w.cause,
                "restart_count": w.restart_count,
                "offset": w.offset,
                "joined_ts": w.joined_ts,
                "join_deadline_ts": w.join_deadline,
            }
            for w in job.pending.values()
        ],
        "last_call_ts": job.last_call,
        "nodes_waiting": job.nodes_waiting(),
        "left": [{"node": n, "reason": why} for n, why in job.left.items()],
        "closed": job.closed,
        "version": job.version,
    }
