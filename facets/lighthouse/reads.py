"""The lighthouse facet's read model: what ``GET /lighthouse`` reads, as the host publishes it
once per cycle (``coordinator/fold/facets.py``, ``Facet.read_model``).

Captured whenever a record reached the facet (each of its records, each tick, a resume): the
settings, the quorum rule's answer at the fold's time then (its status and each replica
group's verdict), the last quorum, the pending requests, the heartbeats and the lost replica
groups, as frozen values and copies. The lighthouse's state is one entry per replica group,
so a capture costs little.
"""

from __future__ import annotations

from typing import Any

from .effects import Settings, Verdict
from .quorum import LastQuorum


class PendingRead:
    """A pending request as read: its replica group, the step it asked at, its record and
    when it joined (ns)."""

    __slots__ = ("replica_id", "step", "offset", "joined_ts")

    def __init__(self, replica_id: str, step: int, offset: int, joined_ts: int) -> None:
        self.replica_id = replica_id
        self.step = step
        self.offset = offset
        self.joined_ts = joined_ts


class LighthouseReads:
    """The lighthouse as of one cycle (see the module docstring)."""

    __slots__ = (
        "settings",
        "quorum_id",
        "status",
        "verdicts",
        "last",
        "requests",
        "heartbeats",
        "lost",
    )

    def __init__(self, fold: Any) -> None:
        """Captured from ``fold``, the facet's ``Lighthouse`` (which imports this module)."""
        decision = fold.decision()
        self.settings: Settings | None = fold.settings
        self.quorum_id: int = fold.quorum_id
        #: the rule's answer (why no quorum yet) while requests wait, else the last one's
        self.status: str = (
            decision.reason if decision is not None and fold.requests else fold.status
        )
        self.verdicts: tuple[Verdict, ...] = decision.verdicts if decision is not None else ()
        self.last: LastQuorum | None = fold.last
        self.requests: tuple[PendingRead, ...] = tuple(
            PendingRead(r, req.member.step, req.offset, req.joined)
            for r, req in sorted(fold.requests.items())
        )
        #: replica id -> its last heartbeat (ns), by id
        self.heartbeats: dict[str, int] = dict(sorted(fold.beats.items()))
        #: replica id -> the offset of the record that lost it, by id
        self.lost: dict[str, int] = {r: offset for r, (offset, _) in sorted(fold.lost.items())}
