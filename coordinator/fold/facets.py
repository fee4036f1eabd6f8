"""Facets: the kinds of state the fold keeps beside membership, added in one way.

Membership (ranks, links, the Healthy Set, views, proposals, the barrier) is the fold's core
(``machine.py``). Everything else a job brings is a *facet*, one folder of its own plugged in
through the registry (``registry.py``): epoch plans and the data partitions that survive a
dead rank (``facets/epochs/``), weight refits between two groups
(``facets/refits/``). Its fold object is what this protocol describes; a facet

- owns some record kinds (``kinds``): the fold hands their checks (:meth:`Facet.refusal`,
  :meth:`Facet.repeat_of`) and their steps (:meth:`Facet.apply`) to it;
- hears of what membership decides, through four hooks, each called at a fixed point of a
  step: a view committed (:meth:`Facet.view_committed`, right after the ``ViewCommitted``
  effect), a rank lost (:meth:`Facet.rank_lost`, at the end of the death chain), a new
  incarnation joined (:meth:`Facet.rank_joined`, after its ``RankState``), time passed
  (:meth:`Facet.tick`, once per tick, after the groups' own deadlines);
- says when it must be woken (:meth:`Facet.next_deadline`) and restarts the deadlines that
  wait on the ranks when the coordinator resumes serving (:meth:`Facet.resume`);
- snapshots to plain JSON data under its ``name`` and restores from it;
- publishes its **read model** (:meth:`Facet.read_model`): an immutable value of what its
  routes and console panel read, which the host publishes beside membership's once per cycle
  (``coordinator/host/reads.py``), so that no reader ever holds the live fold object.

Its effects are declared in its folder and become projection rows and agent updates through
what its plugin registers (``registry.FacetPlugin``), like membership's. A facet is as pure as
the fold: no I/O, no clock, no randomness; it reads the fold's groups through
:class:`FoldContext` and never changes them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar

from ...eventlog.record import Record
from .effects import Effect, View
from .state import GroupState

#: (code, message)
Refusal = tuple[str, str]


class FoldContext(Protocol):
    """What a facet may read of the fold."""

    @property
    def now(self) -> int:
        """The fold's time (ns): the largest record ``ts`` seen."""

    @property
    def group_states(self) -> Mapping[str, GroupState]:
        """Every group's state, by name (read only)."""


class Facet(Protocol):
    """A kind of state the fold keeps beside membership (see the module docstring)."""

    #: the key of its snapshot, and how the docs name it
    name: str
    #: the record kinds it owns
    kinds: frozenset[str]
    #: those of its kinds that :meth:`repeat_of` may find an earlier input for
    repeatable: frozenset[str]

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        """Why an input of one of its kinds must not be applied now, or None."""

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        """The offset of the earlier input this one repeats (answered with it, not appended)."""

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Step a record of one of its kinds that :meth:`refusal` accepted."""

    def view_committed(
        self,
        fold: FoldContext,
        g: GroupState,
        view: View,
        base: View | None,
        record: Record,
        effects: list[Effect],
    ) -> None:
        """``view`` just became ``g``'s committed view (``base`` the one it replaced)."""

    def rank_lost(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """``rank`` of ``g`` just went OFFLINE (any way: a death, a timeout, an exit)."""

    def rank_joined(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """A new incarnation of ``rank`` of ``g`` just joined (a replacement process)."""

    def tick(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Time passed: fire what is due at ``fold.now``."""

    def next_deadline(self) -> int | None:
        """The earliest time (ns) a tick has something to do, or None."""

    def waits_on_ranks(self) -> bool:
        """Whether one of its deadlines waits on the ranks (so a resumed tick must restart it)."""

    def resume(self, now: int) -> None:
        """The coordinator resumed serving at ``now``: restart every deadline that waits on
        the ranks."""

    def snapshot(self) -> dict[str, Any]:
        """Its whole state as JSON-able data."""

    def restore(self, data: dict[str, Any]) -> None:
        """Take the state of :meth:`snapshot` (also after a JSON round trip)."""

    def read_model(self, previous: Any | None) -> Any:
        """Its read model as it stands now: a value nothing changes once it is returned (plain
        data or frozen values), whose query methods the facet's routes and console read.

        ``previous`` None: one built from scratch, and what changed since the last call stays
        noted. Otherwise ``previous`` is the one it returned last for this fold (one publisher
        per fold): the facet builds the next one from it, sharing what did not change since,
        and forgets what it had noted. Equal, read by read, to one built from scratch
        (``tests/host/test_reads.py``)."""


K = TypeVar("K")
S = TypeVar("S")
R = TypeVar("R")


def rerendered(
    previous: Mapping[K, R], current: Mapping[K, S], moved: Iterable[K], render: Callable[[S], R]
) -> dict[K, R]:
    """A facet's read model, copy-on-write by key: ``previous``'s entries, with those of
    ``moved`` rendered again from ``current`` (a key gone from ``current`` is dropped); every
    other entry is shared with ``previous``."""
    out = dict(previous)
    for key in moved:
        state = current.get(key)
        if state is None:
            out.pop(key, None)
        else:
            out[key] = render(state)
    return out
