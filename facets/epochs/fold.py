"""Epoch plans: data that survives a dead rank (the ``epochs`` facet, docs/data.md).

An epoch plan (``epoch_plan`` record) declares one pass over a dataset: its size, the seed and
whether the epoch's permutation is shuffled, how it is split, the grain (positions handed out
together) and the lookahead (how far a rank's sampler may read ahead of what it reported).
The fold gives each active rank of the committed view a **sequence** of ranges of the epoch's
permutation (``facets.epochs.partition``); ranks report how far they are (``progress``:
``processed`` positions from the front of their sequence); and when the view changes, or a rank
runs dry, ranges move, each move a committed decision (``AssignmentChanged``).

The rules, each a method below with its reason:

- **Every position is in exactly one rank's sequence, always** (``covers_exactly``): ranges
  move as whole slices from the end of one sequence to the end of another. The positions not yet
  reported processed shrink only by reported progress: a move hands work over, it never drops
  any, and a processed position is never given out again. So within an epoch every position is
  processed exactly once, by the fold's accounting (docs/data.md says what that means for a
  batch a dead rank never finished: it was not reported, so it is read again).
- **A rank leaving the view gives up everything it has not reported** (death, deactivation,
  auto-deactivation: the view that no longer holds it). Its remainder is split across the new
  view's members by the plan's weights (equal, ``partition_ratios``, or the ranks' reported
  rates), committed with that view.
- **A joiner gets a fair share**: a rank active in a view that was not active in the one before
  and holds nothing takes its weighted share of what is left from the members with the most to
  spare.
- **Reclaim**: with ``reclaim`` on, a rank that reported its whole sequence processed takes from
  the tail of the rank expected to finish last, enough that both finish together; so does a
  dry rank that reports again, and a rank's new process sent an empty part.
- **A move never takes what a live rank may already be reading.** A rank's sampler hands out at
  most ``lookahead`` positions beyond what the fold has accepted from it, so a move takes only
  positions past a donor's ``processed + lookahead``. A donor's reports against an assignment
  older than the move (its ``fence``) are refused ``stale_assignment``: until the rank has
  received what it holds now, its sampler cannot widen its window. A rank leaving the view
  keeps nothing: what it read and did not report is read again by its successors.
- **A report is bound to the assignment it was made under.** It counts positions of the
  rank's sequence as it was at that assignment: one against an assignment before a move that
  shortened the part is stale (the fence, above), and one against an assignment before a
  move that lengthened it counts at most what the rank held then (``grown``). So a report
  made before a deactivation, reactivation or reassignment is refused ``stale_assignment``,
  never credited to the share given after it.
- **Progress is evidence, checked like every input**: from the rank's current, online
  incarnation, for the open epoch, never regressing, never beyond what the rank holds.

Iteration is in rank order everywhere, shares are integer arithmetic
(``partition.apportion``), so a replay decides exactly the same moves.
"""

from __future__ import annotations

import math
from typing import Any

import msgspec

from ...coordinator.fold.effects import OFFLINE, Effect, View
from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.state import GroupState
from ...eventlog.record import Record
from .checks import EpochChecks
from .effects import (
    EpochCompleted,
    EpochPlanned,
    PartSent,
)
from .inputs import (
    EpochPlan,
    EpochsInput,
    ProgressInput,
    decode,
)
from .moves import decide, movable, plan_weights, rate_weights, view_moves
from .partition import (
    Segment,
    apportion,
    deal,
)
from .reads import EpochsReads, GroupEpochReads, read_model
from .state import Epoch, GroupEpochs

#: The transition table: each input (``inputs.py``), the rule that steps it and what it moves.
TRANSITIONS: dict[type[EpochsInput], str] = {
    EpochPlan: "_plan",  # a new epoch: the active ranks' first parts
    ProgressInput: "_progress",  # the rank's cursor (dry: it may reclaim; the last: complete)
}


class Epochs:
    """The ``epochs`` facet (see the module docstring)."""

    name = "epochs"
    kinds = frozenset({"epoch_plan", "progress"})
    repeatable = frozenset({"epoch_plan"})

    def __init__(self) -> None:
        self._groups: dict[str, GroupEpochs] = {}
        self._checks = EpochChecks(self._groups)
        #: what changed since the last read model (``reads.py``), by group: those ranks' rows
        #: (a set) or the whole group (None)
        self._dirty: dict[str, set[int] | None] = {}

    # -- queries ----------------------------------------------------------------------------

    def epoch(self, group: str) -> Epoch | None:
        """The group's open or last epoch (read only)."""
        ge = self._groups.get(group)
        return None if ge is None else ge.current

    def changes(self, group: str) -> int:
        """How many decisions about ``group``'s epochs were made (its ``assignment`` rows)."""
        ge = self._groups.get(group)
        return 0 if ge is None else ge.changes

    def rates(self, group: str) -> dict[int, float]:
        ge = self._groups.get(group)
        return {} if ge is None else dict(ge.rates)

    def status(self, group: str) -> dict[str, Any] | None:
        """The open or last epoch of ``group`` as plain data (``GET /groups/{g}/epochs``)."""
        ge = self._groups.get(group)
        return (
            None
            if ge is None
            else EpochsReads({group: GroupEpochReads.of(group, ge)}).status(group)
        )

    def read_model(self, previous: EpochsReads | None) -> EpochsReads:
        """See ``coordinator.fold.facets.Facet.read_model`` and ``reads.py``."""
        if previous is None:
            return read_model(self._groups, None, {})
        dirty, self._dirty = self._dirty, {}
        return read_model(self._groups, previous, dirty)

    def _touched(self, group: str, rank: int | None = None) -> None:
        """Note a change of ``group`` for the next read model: ``rank``'s row only, or the
        whole group."""
        dirty = self._dirty
        if rank is None:
            dirty[group] = None
        elif group not in dirty:
            dirty[group] = {rank}
        else:
            ranks = dirty[group]
            if ranks is not None:
                ranks.add(rank)

    # -- checks (``checks.py``) -----------------------------------------------------------

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        return self._checks.refusal(fold, kind, group, rank, payload)

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        return self._checks.repeat_of(fold, kind, group, rank, payload)

    # -- steps ------------------------------------------------------------------------------

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Step an input: its Struct (``inputs.py``) picks the rule (:data:`TRANSITIONS`)."""
        g = fold.group_states[record.group]  # type: ignore[index]
        inp = decode(record.kind, record.payload)
        getattr(self, TRANSITIONS[type(inp)])(g, inp, record, effects)

    def _plan(self, g: GroupState, plan: EpochPlan, record: Record, effects: list[Effect]) -> None:
        """The first split: the active ranks of the committed view get contiguous ranges of
        the permutation, in rank order, sized by the plan's weights in whole grains."""
        assert g.view is not None
        ge = self._groups.setdefault(g.name, GroupEpochs())
        self._touched(g.name)
        e = Epoch(plan, record.offset, g.view.version)
        ge.current = e
        members = g.view.active_ranks
        shares = apportion(plan.dataset_size, plan_weights(ge, e, g, members), plan.grain)
        pool: list[Segment] = [(0, plan.dataset_size)]
        for rank, segments in deal(pool, shares).items():
            h = e.holding(rank)
            h.sequence = segments
            h.assignment = 1
        ge.changes += 1
        effects.append(
            EpochPlanned(
                group=g.name,
                epoch=plan.epoch,
                plan=msgspec.to_builtins(plan),
                version=e.version,
                assignment=1,
                change=ge.changes,
                ranges=tuple(e.holdings[r].as_range(r) for r in sorted(e.holdings)),
                offset=record.offset,
            )
        )

    def _progress(
        self, g: GroupState, progress: ProgressInput, record: Record, effects: list[Effect]
    ) -> None:
        """The rank's cursor moves; a rank that ran dry may reclaim; the last report of the
        epoch completes it."""
        rank = record.rank
        assert rank is not None
        ge = self._groups[g.name]
        e = ge.current
        assert e is not None
        self._touched(g.name, rank)
        if progress.rate is not None:
            ge.rates[rank] = float(progress.rate)
        h = e.holdings.get(rank)
        if h is None:
            return
        if progress.processed == h.processed:
            # a dry rank that reports again asks again: what was not spare may be now
            self._reclaim_if_dry(g, ge, e, rank, record, effects)
            return
        e.unprocessed -= progress.processed - h.processed
        h.processed = progress.processed
        if e.unprocessed == 0:
            self._complete(g, e, record, effects)
        else:
            self._reclaim_if_dry(g, ge, e, rank, record, effects)

    def _complete(self, g: GroupState, e: Epoch, record: Record, effects: list[Effect]) -> None:
        e.completed = record.offset
        effects.append(
            EpochCompleted(
                group=g.name,
                epoch=e.number,
                processed={r: h.processed for r, h in sorted(e.holdings.items()) if h.processed},
                offset=record.offset,
            )
        )

    def _reclaim_if_dry(
        self,
        g: GroupState,
        ge: GroupEpochs,
        e: Epoch,
        rank: int,
        record: Record,
        effects: list[Effect],
    ) -> None:
        """With ``reclaim`` on, an active rank that holds nothing more to process while the
        epoch still has work reclaims (at its report, or as a new process sent an empty part)."""
        h = e.holdings[rank]
        if (
            h.remaining == 0
            and e.unprocessed > 0
            and e.plan.reclaim
            and g.view is not None
            and g.view.is_active(rank)
        ):
            self._reclaim(g, ge, e, rank, record, effects)

    def _reclaim(
        self,
        g: GroupState,
        ge: GroupEpochs,
        e: Epoch,
        rank: int,
        record: Record,
        effects: list[Effect],
    ) -> None:
        """``rank`` finished its sequence: it takes from the tail of the rank expected to
        finish last (its remaining work over its rate; an OFFLINE rank never finishes) as much
        as makes both finish together, in whole grains, never within the donor's lookahead.
        If that rank has nothing to spare, the next one is asked; with nothing to spare
        anywhere, ``rank`` waits for the epoch's end (or for a later view to give it work)."""
        self._touched(g.name)
        weights = rate_weights(ge, g, list(e.holdings))
        mine = weights[rank]
        grain = e.plan.grain

        def finish(r: int) -> float:
            if g.ranks[r].state == OFFLINE:
                return math.inf
            return e.holdings[r].remaining / weights[r]

        donors = [r for r, h in e.holdings.items() if r != rank and movable(e, h) >= grain]
        for donor in sorted(donors, key=lambda r: (-finish(r), r)):
            h = e.holdings[donor]
            spare = movable(e, h)
            if g.ranks[donor].state == OFFLINE:
                want = spare
                why = "OFFLINE"
            else:
                want = h.remaining * mine // (mine + weights[donor])
                rate = ge.rates.get(donor)
                why = f"about {h.remaining / rate:.3g} s at {rate:.4g}/s" if rate else "no rate"
            give = min(want, spare) // grain * grain
            if give < grain:
                continue
            decide(
                g,
                ge,
                e,
                {donor: give},
                {rank: give},
                "reclaim",
                f"rank {rank} finished its part; it took {give} of rank {donor}'s "
                f"{h.remaining} remaining positions (rank {donor} expected to finish last: "
                f"{why})",
                record,
                effects,
            )
            return

    def view_committed(
        self,
        fold: FoldContext,
        g: GroupState,
        view: View,
        base: View | None,
        record: Record,
        effects: list[Effect],
    ) -> None:
        """Ranks that left the view give up their remainders, split across the new view's
        members by the plan's weights; then each joiner (active now, not in the view before,
        holding nothing) takes its weighted share of what is left from the members with the
        most to spare. Both are one decision, committed with the view."""
        ge = self._groups.get(g.name)
        e = None if ge is None else ge.current
        if ge is None or e is None or e.completed is not None:
            return
        gives, gets, details = view_moves(e, view, base, plan_weights(ge, e, g, view.active_ranks))
        if gives:
            self._touched(g.name)
            decide(
                g,
                ge,
                e,
                gives,
                gets,
                "view_committed",
                "; ".join(details),
                record,
                effects,
                version=view.version,
            )

    def rank_lost(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """Nothing moves when a rank goes OFFLINE: its remainder moves with the view that no
        longer holds it (an OFFLINE rank still in the view gives way to reclaim)."""

    def rank_joined(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """A new incarnation of a rank that holds a part of the open epoch is sent that part
        whole (``PartSent``): what its predecessors reported is in no decision of the log (a
        rank that finished its part and then died left no move behind), so a replacement
        starts from what is unclaimed, not from the plan's cursor. A part sent empty reclaims
        at once (with ``reclaim`` on), instead of the process waiting for the epoch's end."""
        ge = self._groups.get(g.name)
        e = None if ge is None else ge.current
        if e is None or e.completed is not None:
            return
        h = e.holdings.get(rank)
        if h is None:
            return
        effects.append(
            PartSent(
                group=g.name,
                rank=rank,
                epoch=e.number,
                assignment=e.assignment,
                processed=h.processed,
                remaining=tuple(h.remaining_segments()),
                offset=record.offset,
            )
        )
        assert ge is not None
        self._reclaim_if_dry(g, ge, e, rank, record, effects)

    def tick(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """No epoch rule waits on time."""

    def next_deadline(self) -> int | None:
        return None

    def waits_on_ranks(self) -> bool:
        return False

    def resume(self, now: int) -> None:
        """No epoch rule waits on time."""

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {name: self._groups[name].to_dict() for name in sorted(self._groups)}

    def restore(self, data: dict[str, Any]) -> None:
        self._groups.clear()  # in place: the checks read the same dict
        self._groups.update({name: GroupEpochs.from_dict(d) for name, d in data.items()})
        self._dirty = dict.fromkeys(self._groups)
