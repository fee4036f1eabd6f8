"""The toy facet's fold: a counter per group that a ``toy_bump`` record (the operator's) or a
``toy_add`` record (a rank's, sent by its agent) raises by ``by``."""

from __future__ import annotations

from typing import Any

import msgspec

from foldplane.coordinator.fold.effects import Effect, View
from foldplane.coordinator.fold.facets import FoldContext, Refusal
from foldplane.coordinator.fold.fencing import online_rank_refusal
from foldplane.coordinator.fold.projections import to_doc
from foldplane.coordinator.fold.state import GroupState
from foldplane.eventlog import ProjectionRow, Record
from foldplane.wire.codes import INVALID_EVENT, UNKNOWN_GROUP
from tests.facets.toy.inputs import INPUTS, by_problem


class CounterBumped(Effect, frozen=True, kw_only=True, tag="toy_bumped"):
    """``group``'s counter is ``count`` now, after a bump of ``by``."""

    group: str
    count: int
    by: int
    offset: int


def counter_row(effect: CounterBumped) -> list[ProjectionRow]:
    return [ProjectionRow("toy_counter", effect.group, 0, to_doc(effect))]


class CounterReads:
    """The read model (``Facet.read_model``): the counters as of one cycle, which the routes
    read."""

    __slots__ = ("_counts",)

    def __init__(self, counts: dict[str, int]) -> None:
        self._counts = counts

    def count(self, group: str) -> int:
        return self._counts.get(group, 0)


class Counters:
    """The ``toy`` facet (``coordinator.fold.facets.Facet``)."""

    name = "toy"
    kinds = frozenset({"toy_bump", "toy_add"})
    repeatable: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        #: whether a counter moved since the last read model
        self._moved = False

    def count(self, group: str) -> int:
        return self.counts.get(group, 0)

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        """A bump names a known group and no rank (the operator's), an add a rank's current
        online incarnation (an agent's); each ``by`` from 1 to :data:`MAX_BY`."""
        if group is None or (rank is not None) != (kind == "toy_add"):
            return (
                INVALID_EVENT,
                f"{kind} names a group and {'a' if kind == 'toy_add' else 'no'} rank",
            )
        g = fold.group_states.get(group)
        if g is None:
            return UNKNOWN_GROUP, f"no group named {group!r}"
        if kind == "toy_add" and (
            refused := online_rank_refusal(g, kind, rank, payload.get("incarnation"))
        ):
            return refused
        if (problem := by_problem(payload)) is not None:
            return INVALID_EVENT, f"{kind}: {problem}"
        return None

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        return None

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Both inputs raise the counter: the class says whose it is, ``by`` how much."""
        group, by = record.group, msgspec.convert(record.payload, INPUTS[record.kind]).by
        assert group is not None
        self.counts[group] = count = self.count(group) + by
        self._moved = True
        effects.append(CounterBumped(group=group, count=count, by=by, offset=record.offset))

    def view_committed(
        self,
        fold: FoldContext,
        g: GroupState,
        view: View,
        base: View | None,
        record: Record,
        effects: list[Effect],
    ) -> None:
        pass

    def rank_lost(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        pass

    def rank_joined(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        pass

    def tick(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        pass

    def next_deadline(self) -> int | None:
        return None

    def waits_on_ranks(self) -> bool:
        return False

    def resume(self, now: int) -> None:
        pass

    def snapshot(self) -> dict[str, Any]:
        return {"counts": dict(self.counts)}

    def restore(self, data: dict[str, Any]) -> None:
        self.counts = dict(data["counts"])
        self._moved = True

    def read_model(self, previous: CounterReads | None) -> CounterReads:
        """A copy of the counters when one moved since ``previous`` (or from scratch)."""
        if previous is not None:
            if not self._moved:
                return previous
            self._moved = False
        return CounterReads(dict(self.counts))
