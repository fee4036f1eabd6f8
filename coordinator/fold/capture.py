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

What to capture again the fold says itself: it notes, as it steps, the groups and proposals
its steps changed (:class:`FoldChanges`, taken by the read model's publisher once per cycle),
and its proposals are a :class:`Proposals` dict that notes each id written, so a proposal
written copies one page of :class:`ProposalPages`, never every proposal the job made.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
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


class FoldChanges:
    """What the fold's steps changed since the read model last took them (:meth:`take`): what
    it must capture again. The fold notes them as it steps (``machine.py``, ``deadlines.py``)."""

    __slots__ = ("groups", "beaten", "proposals")

    def __init__(self) -> None:
        #: groups a step other than a heartbeat may have changed: a record of membership's
        #: that names the group, a tick that found a deadline of it due (every group on a
        #: resumed tick). A facet's record changes no group (a facet never changes them), a
        #: refused record nothing
        self.groups: set[str] = set()
        #: groups whose ranks' last beats a heartbeat record moved (nothing else of them)
        self.beaten: set[str] = set()
        #: proposals written (new or resolved), by id
        self.proposals: set[int] = set()

    def take(self) -> FoldChanges:
        """What was noted since the last call (the read model's publisher is the one caller),
        and nothing noted from now on."""
        got = FoldChanges()
        got.groups, self.groups = self.groups, set()
        got.beaten, self.beaten = self.beaten, set()
        got.proposals, self.proposals = self.proposals, set()
        return got


class Proposals(dict[int, Proposal]):
    """The fold's proposals by id, in the order they came, each id written noted in its
    :class:`FoldChanges`."""

    __slots__ = ("_changes",)

    def __init__(self, changes: FoldChanges) -> None:
        super().__init__()
        self._changes = changes

    def __setitem__(self, key: int, value: Proposal) -> None:
        self._changes.proposals.add(key)
        dict.__setitem__(self, key, value)


def proposals_of(machine: Any) -> Mapping[int, Proposal]:
    """Every proposal of the fold ``machine`` (a ``Coordinator``, which imports this module)
    by id, in the order they came: read-only, the read model captures it."""
    return machine._proposals  # type: ignore[no-any-return]  # noqa: SLF001 - same package


#: Proposal ids per page of :class:`ProposalPages` (what a written proposal copies).
PAGE = 256


class ProposalPages(Mapping[int, Proposal]):
    """Every proposal by id, as captured, in pages of :data:`PAGE` ids: a capture after some
    proposals were written (:meth:`with_written`) copies their pages and the page table and
    shares every other page, so its cost does not grow with the proposals the job ever made.
    Read-only; iterates in id order (the order the proposals came), ``reversed`` newest
    first."""

    __slots__ = ("_pages", "_len")

    def __init__(self, pages: dict[int, dict[int, Proposal]], n: int) -> None:
        self._pages = pages
        self._len = n

    @classmethod
    def of(cls, proposals: Mapping[int, Proposal]) -> ProposalPages:
        """Captured whole."""
        pages: dict[int, dict[int, Proposal]] = {}
        for pid in sorted(proposals):
            pages.setdefault(pid // PAGE, {})[pid] = proposals[pid]
        return cls(pages, len(proposals))

    def with_written(self, proposals: Mapping[int, Proposal], ids: set[int]) -> ProposalPages:
        """This capture with the proposals ``ids`` as ``proposals`` holds them now."""
        if not ids:
            return self
        pages = dict(self._pages)
        copied: set[int] = set()
        n = self._len
        for pid in sorted(ids):
            k = pid // PAGE
            if k not in copied:
                old = pages.get(k)
                pages[k] = {} if old is None else dict(old)
                copied.add(k)
            page = pages[k]
            if pid not in page:
                n += 1
            page[pid] = proposals[pid]
        return ProposalPages(pages, n)

    def __getitem__(self, pid: int) -> Proposal:
        if not isinstance(pid, int):
            raise KeyError(pid)
        page = self._pages.get(pid // PAGE)
        if page is None:
            raise KeyError(pid)
        return page[pid]

    def __iter__(self) -> Iterator[int]:
        pages = self._pages
        for k in sorted(pages):
            yield from pages[k]

    def __reversed__(self) -> Iterator[int]:
        pages = self._pages
        for k in sorted(pages, reverse=True):
            yield from reversed(pages[k])

    def __len__(self) -> int:
        return self._len
