"""The lighthouse facet's effects: its settings taken, a quorum decided, a replica group lost
(the glossary of the rest is ``coordinator/fold/effects.py``)."""

from __future__ import annotations

import msgspec

from ...coordinator.fold.effects import Effect
from .messages import QuorumMember


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The quorum rule's settings, named and defaulted as torchft's lighthouse names them
    (``torchft_lighthouse --min_replicas --join_timeout_ms --quorum_tick_ms
    --heartbeat_timeout_ms``; ``serve --lighthouse-min-replicas ...``)."""

    #: the fewest replica groups a new quorum may have (torchft has no default: it must be said)
    min_replicas: int
    #: how long a quorum that could form waits for replica groups that heartbeat but have not
    #: asked to join yet (stragglers), from the first request
    join_timeout_ms: int = 60_000
    #: the least time between two ticks of the rule while a quorum is waiting
    quorum_tick_ms: int = 100
    #: how long after its last heartbeat a replica group counts as dead
    heartbeat_timeout_ms: int = 5_000

    def problem(self) -> str | None:
        """What is wrong with these settings, or None."""
        day = 86_400_000
        if not 1 <= self.min_replicas <= 1 << 20:
            return f"min_replicas must be from 1 to {1 << 20}, got {self.min_replicas}"
        for name, low in (("join_timeout_ms", 0), ("quorum_tick_ms", 1),
                          ("heartbeat_timeout_ms", 1)):  # fmt: skip
            value = getattr(self, name)
            if not low <= value <= day:
                return f"{name} must be from {low} to {day} (a day), got {value}"
        return None


class Verdict(msgspec.Struct, frozen=True, kw_only=True):
    """Why one replica group is in a quorum or out of it."""

    replica_id: str
    included: bool
    why: str


class LighthouseConfigured(Effect, frozen=True, kw_only=True, tag="lighthouse_configured"):
    """The quorum rule runs with ``settings`` from this record on."""

    settings: Settings
    offset: int


class QuorumDecided(Effect, frozen=True, kw_only=True, tag="lighthouse_quorum"):
    """A quorum: ``participants`` in replica-rank order (sorted by replica id, as torchft
    orders them), each as it asked (its step, its reconfigure handles), with the offset of the
    request each was taken from (``requests``). ``quorum_id`` is the lighthouse's version:
    ``changed`` says it went up with this decision (the participants changed, or one of them
    reported commit failures); an unchanged quorum is decided again each time its members ask.
    ``reason`` is the rule's (``fold.quorum_compute``), ``verdicts`` say why each replica group
    it knows of is in or out, ``created`` is the deciding record's time (ns)."""

    quorum_id: int
    changed: bool
    participants: tuple[QuorumMember, ...]
    requests: tuple[int, ...]
    reason: str
    verdicts: tuple[Verdict, ...]
    created: int
    offset: int


class ReplicaLost(Effect, frozen=True, kw_only=True, tag="lighthouse_lost"):
    """A launcher reported replica group ``replica`` dead (``reason``): ``replica_ids`` are
    the incarnations of it the lighthouse knew, now out of every quorum without waiting for
    their heartbeats to time out."""

    replica: str
    replica_ids: tuple[str, ...]
    reason: str
    offset: int
