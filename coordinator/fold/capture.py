"""A group's state captured at one offset: what its status and the console's picture are made from.

The fold mutates :class:`~coordinator.fold.state.GroupState` in place (a heartbeat costs a few
dict operations); the read model the host publishes each cycle (``coordinator/host/reads.py``)
must not change under its readers, so it holds a :class:`GroupCapture` instead: the same
fields, copied into values nothing mutates. ``status.py`` and ``overview.py`` read a capture,
never the live state, so what a reader is shown is exactly what was captured.

Cost, per group captured: one tuple per field of a rank, over every rank (C-level ``map`` of an
``attrgetter``; about 5 ms at 16,384 ranks), the online ranks' last beats (a dict copy) and the
change in flight's rank sets. A
heartbeat changes only the last beats (``ranks.py``'s fast path), so :meth:`with_beats` reuses
everything else and copies only those.
"""

from __future__ import annotations

from collections.abc import Iterator
from operator import attrgetter
from typing import Any

from .config import GroupConfig, Resolved
from .effects import Proposal, View
from .state import Change, GroupState

#: What a capture keeps of each rank (``RankInfo``), in this order.
RANK_FIELDS = (
    "state",
    "incarnation",
    "rank_epoch",
    "last_heartbeat_ts",
    "exited",
    "self_ready",
    "down",
)
_GETTERS = tuple(attrgetter(field) for field in RANK_FIELDS)
_INDEX = {field: i for i, field in enumerate(RANK_FIELDS)}


class ChangeCapture:
    """The change in flight as captured (``state.Change``'s fields, the sets frozen)."""

    __slots__ = (
        "version",
        "active",
        "participants",
        "waiting",
        "acked",
        "dropped",
        "exited",
        "ack_deadline",
        "_cause",
    )

    def __init__(self, change: Change) -> None:
        self.version = change.version
        self.active = change.active
        self.participants = change.participants
        self.waiting = frozenset(change.waiting)
        self.acked = frozenset(change.acked)
        self.dropped = frozenset(change.dropped)
        self.exited = frozenset(change.exited)
        self.ack_deadline = change.ack_deadline
        self._cause = change.cause()

    def cause(self) -> dict[str, Any]:
        """``Change.cause()`` as captured (a fresh dict each time, as the live one gives)."""
        return {**self._cause, "proposals": list(self._cause["proposals"])}


class GroupCapture:
    """One group as the fold held it at one offset (see the module docstring).

    ``columns`` holds one tuple per field of :data:`RANK_FIELDS`, over every rank (``rows()``
    gives them rank by rank); ``alive`` the online ranks' last sign of life; ``queue`` the pending proposals' ids. The rest are the
    ``GroupState`` fields of the same names, each an immutable value or a copy."""

    __slots__ = (
        "name",
        "config",
        "cfg",
        "created_offset",
        "columns",
        "alive",
        "healthy",
        "window_end",
        "formation",
        "formation_error",
        "failures",
        "failed",
        "shutdown",
        "view",
        "change",
        "queue",
        "uuids",
        "ended",
        "ended_offset",
        "deleted",
        "finished",
    )

    name: str
    config: GroupConfig
    cfg: Resolved
    view: View | None

    def __init__(self, g: GroupState) -> None:
        self.name = g.name
        self.config = g.config
        self.cfg = g.cfg
        self.created_offset = g.created_offset
        ranks = g.ranks
        self.columns: tuple[tuple[Any, ...], ...] = tuple(
            tuple(map(get, ranks)) for get in _GETTERS
        )
        self.alive: dict[int, int] = dict(g.alive)
        self.healthy = frozenset(g.healthy)
        self.window_end = g.window_end
        self.formation = g.formation
        self.formation_error = g.formation_error
        self.failures = g.failures
        self.failed = tuple(g.failed)
        self.shutdown = g.shutdown
        self.view = g.view
        self.change = None if g.change is None else ChangeCapture(g.change)
        self.queue = tuple(pid for pid, _ in g.queue)
        self.uuids = dict(g.uuids)
        self.ended = g.ended
        self.ended_offset = g.ended_offset
        self.deleted = g.deleted
        self.finished = g.finished

    def with_beats(self, g: GroupState) -> GroupCapture:
        """This capture with ``g``'s last beats: what a cycle of heartbeats alone changes."""
        new = object.__new__(GroupCapture)
        for field in GroupCapture.__slots__:
            object.__setattr__(new, field, getattr(self, field))
        new.alive = dict(g.alive)
        return new

    def column(self, field: str) -> tuple[Any, ...]:
        """Every rank's ``field`` (one of :data:`RANK_FIELDS`), in rank order."""
        return self.columns[_INDEX[field]]

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Each rank's fields (:data:`RANK_FIELDS`, in that order), in rank order."""
        return zip(*self.columns, strict=True)

    @property
    def world_size(self) -> int:
        return self.config.world_size

    @property
    def active(self) -> tuple[int, ...]:
        return self.view.active_ranks if self.view is not None else ()

    @property
    def version(self) -> int:
        return self.view.version if self.view is not None else 0


def proposals_of(machine: Any) -> dict[int, Proposal]:
    """Every proposal of the fold ``machine`` (a ``Coordinator``, which imports this module)
    by id, in the order they came: read-only, the read model copies it."""
    return machine._proposals  # type: ignore[no-any-return]  # noqa: SLF001 - same package
