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
from ...coordinator.fold.fencing import online_rank_refusal
from ...coordinator.fold.reasons import abridged, ranks_text
from ...coordinator.fold.state import FAILED, GroupState
from ...eventlog.record import Record
from ...wire.codes import (
    EPOCH_CONFLICT,
    GROUP_FAILED,
    GROUP_NOT_FORMED,
    INVALID_EVENT,
    STALE_ASSIGNMENT,
    UNKNOWN_EPOCH,
    UNKNOWN_GROUP,
)
from .effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
    Move,
    PartSent,
)
from .inputs import (
    EpochPlan,
    EpochsInput,
    ProgressInput,
    decode,
    plan_problem,
    progress_problem,
)
from .partition import (
    Segment,
    apportion,
    deal,
    integer_weights,
    normalized,
    split_at,
)
from .state import Epoch, GroupEpochs, Holding

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
        if ge is None or ge.current is None:
            return None
        e = ge.current
        return {
            "group": group,
            "epoch": e.number,
            "plan": msgspec.to_builtins(e.plan),
            "offset": e.offset,
            "version": e.version,
            "assignment": e.assignment,
            "status": "complete" if e.completed is not None else "open",
            "completed_offset": e.completed,
            "dataset_size": e.plan.dataset_size,
            "unprocessed": e.unprocessed,
            "ranks": [
                {
                    "rank": r,
                    "held": h.held,
                    "processed": h.processed,
                    "remaining": [list(s) for s in h.remaining_segments()],
                    "assignment": h.assignment,
                    "fence": h.fence,
                    "rate": ge.rates.get(r),
                }
                for r, h in sorted(e.holdings.items())
            ],
        }

    # -- checks -----------------------------------------------------------------------------

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        if not isinstance(payload, dict):
            return INVALID_EVENT, f"payload must be an object, got {type(payload).__name__}"
        if group is None:
            return INVALID_EVENT, f"a {kind} record must name a group"
        g = fold.group_states.get(group)
        if g is None:
            return UNKNOWN_GROUP, f"no group named {group!r}"
        if kind == "epoch_plan":
            return self._plan_refusal(g, rank, payload)
        return self._progress_refusal(g, rank, payload)

    def _plan_refusal(
        self, g: GroupState, rank: int | None, payload: dict[str, Any]
    ) -> Refusal | None:
        """A plan is for a formed group that is neither failed nor shut down, numbered after
        the group's last epoch, while no epoch is open. The same plan again is the same epoch
        (``repeat_of``); another one under the same number is a conflict."""
        if rank is not None:
            return INVALID_EVENT, f"an epoch plan is the group's, not rank {rank}'s"
        if (err := plan_problem(payload, g.config.world_size)) is not None:
            return INVALID_EVENT, f"epoch_plan: {err}"
        plan = decode("epoch_plan", payload)
        assert isinstance(plan, EpochPlan)
        if g.formation == FAILED:
            return GROUP_FAILED, f"group {g.name!r} failed to form: {g.formation_error}"
        if g.shutdown is not None:
            return GROUP_FAILED, f"group {g.name!r} was shut down ({g.shutdown})"
        if g.view is None:
            return GROUP_NOT_FORMED, (
                f"group {g.name!r} has no committed view yet: an epoch is planned over the "
                "active ranks of one"
            )
        number = plan.epoch
        e = self.epoch(g.name)
        if e is not None:
            if number == e.number:
                if plan == e.plan:
                    return EPOCH_CONFLICT, f"epoch {number} is already planned (offset {e.offset})"
                return EPOCH_CONFLICT, (
                    f"epoch {number} is already planned (offset {e.offset}) with another plan: "
                    f"{_plan_diff(e.plan, plan)}"
                )
            if number < e.number:
                return EPOCH_CONFLICT, (
                    f"epoch numbers increase: {number} is not after epoch {e.number}"
                )
            if e.completed is None:
                return EPOCH_CONFLICT, f"epoch {e.number} is still open: {_left_text(e)}"
        if plan.split == "ratios" and not any(
            plan.partition_ratios[r] > 0  # type: ignore[index]
            for r in g.view.active_ranks
        ):
            return INVALID_EVENT, (
                "epoch_plan: partition_ratios gives no active rank of version "
                f"{g.view.version} ({ranks_text(g.view.active_ranks)}) a positive ratio"
            )
        return None

    def _progress_refusal(
        self, g: GroupState, rank: int | None, payload: dict[str, Any]
    ) -> Refusal | None:
        """Progress is from the rank's current online incarnation, for the open epoch,
        against an assignment the rank may still hold, never regressing and never beyond what
        it holds. A report equal to the last accepted one is accepted and changes nothing."""
        if (err := progress_problem(payload)) is not None:
            return INVALID_EVENT, f"progress: {err}"
        progress = decode("progress", payload)
        assert isinstance(progress, ProgressInput)
        if (refused := online_rank_refusal(g, "progress", rank, progress.incarnation)) is not None:
            return refused
        assert rank is not None
        number = progress.epoch
        e = self.epoch(g.name)
        if e is None:
            return UNKNOWN_EPOCH, f"group {g.name!r} has no epoch plan; progress is for one"
        if number != e.number:
            return UNKNOWN_EPOCH, (
                f"epoch {number} is not group {g.name!r}'s current epoch ({e.number}, "
                f"{'complete' if e.completed is not None else 'open'})"
            )
        h = e.holdings.get(rank)
        processed = progress.processed
        assignment = progress.assignment
        if assignment > e.assignment:
            return INVALID_EVENT, (
                f"progress: assignment {assignment} of epoch {number} does not exist (the "
                f"latest is {e.assignment})"
            )
        if h is None:
            if processed == 0:
                return None
            return INVALID_EVENT, (
                f"progress: rank {rank} holds nothing of epoch {number}; it cannot have "
                f"processed {processed} positions"
            )
        if assignment < h.fence:
            return STALE_ASSIGNMENT, (
                f"rank {rank}'s part of epoch {number} was shortened at assignment {h.fence} "
                f"(this report is against {assignment}); report against the part it holds now"
            )
        grown = h.grown_after(assignment) if processed != h.processed else None
        if grown is not None and processed > grown[1]:
            return STALE_ASSIGNMENT, (
                f"rank {rank}'s part of epoch {number} grew at assignment {grown[0]} after its "
                f"first {grown[1]} positions; this report against assignment {assignment} "
                f"counts at most those, not {processed}: report against the part it holds now"
            )
        if processed < h.processed:
            return INVALID_EVENT, (
                f"progress: rank {rank} already reported {h.processed} positions of epoch "
                f"{number} processed; {processed} would go back"
            )
        if processed > h.held:
            return INVALID_EVENT, (
                f"progress: rank {rank} holds {h.held} positions of epoch {number} (assignment "
                f"{h.assignment}); it cannot have processed {processed}"
            )
        return None

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        """The plan an identical ``epoch_plan`` repeats (its offset), else None."""
        if kind != "epoch_plan" or group is None or rank is not None:
            return None
        g = fold.group_states.get(group)
        e = self.epoch(group)
        if g is None or e is None or not isinstance(payload, dict):
            return None
        if plan_problem(payload, g.config.world_size) is not None:
            return None
        plan = decode(kind, payload)
        return e.offset if plan == e.plan else None

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
        e = Epoch(plan, record.offset, g.view.version)
        ge.current = e
        members = g.view.active_ranks
        shares = apportion(plan.dataset_size, self._weights(ge, e, g, members), plan.grain)
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
        weights = self._rate_weights(ge, g, list(e.holdings))
        mine = weights[rank]
        grain = e.plan.grain

        def finish(r: int) -> float:
            if g.ranks[r].state == OFFLINE:
                return math.inf
            return e.holdings[r].remaining / weights[r]

        donors = [r for r, h in e.holdings.items() if r != rank and self._spare(e, h) >= grain]
        for donor in sorted(donors, key=lambda r: (-finish(r), r)):
            h = e.holdings[donor]
            spare = self._spare(e, h)
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
            self._decide(
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
        members = view.active_ranks
        leavers = [
            r for r in sorted(e.holdings) if e.holdings[r].remaining and not view.is_active(r)
        ]
        weights = self._weights(ge, e, g, members)
        gives: dict[int, int] = {}
        gets: dict[int, int] = {}
        details: list[str] = []
        if leavers:
            pooled = sum(e.holdings[r].remaining for r in leavers)
            for r in leavers:
                gives[r] = e.holdings[r].remaining
            shares = apportion(pooled, weights, e.plan.grain)
            for r, n in shares.items():
                if n:
                    gets[r] = gets.get(r, 0) + n
            details.append(
                f"{_ranks_word(leavers)} left the view (version {view.version}): "
                f"{pooled} remaining positions split across {ranks_text(r for r in shares if shares[r])}"
            )
        old = set(base.active_ranks) if base is not None else set()
        joiners = [r for r in members if r not in old and not _holds(e, r) and r not in gets]
        if joiners:
            after = {r: _remaining_after(e, r, gives, gets) for r in members}
            total = sum(after.values())
            target = apportion(total, weights, e.plan.grain) if total else {}
            for j in joiners:
                need = target.get(j, 0)
                taken: list[str] = []
                spare_of = {
                    d: min(
                        max(0, after[d] - target.get(d, 0)),
                        self._spare(e, e.holdings[d]) - gives.get(d, 0),
                    )
                    for d in members
                    if d != j and d in e.holdings and d not in gets
                }
                for d in sorted(spare_of, key=lambda d: (-spare_of[d], d)):
                    give = min(spare_of[d], need) // e.plan.grain * e.plan.grain
                    if give <= 0:
                        continue
                    gives[d] = gives.get(d, 0) + give
                    gets[j] = gets.get(j, 0) + give
                    after[d] -= give
                    after[j] = after.get(j, 0) + give
                    need -= give
                    taken.append(f"{give} from rank {d}")
                    if need < e.plan.grain:
                        break
                if taken:
                    details.append(f"rank {j} joined: it took {abridged(taken)}")
        if gives:
            self._decide(
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

    def _decide(
        self,
        g: GroupState,
        ge: GroupEpochs,
        e: Epoch,
        gives: dict[int, int],
        gets: dict[int, int],
        cause: str,
        detail: str,
        record: Record,
        effects: list[Effect],
        *,
        version: int | None = None,
    ) -> None:
        """One committed move: the tails ``gives`` names (positions per donor, rank order)
        leave their sequences into one pool, dealt in rank order to the ranks of ``gets``.
        Donors are fenced at the new assignment; a rank whose part did not change keeps its
        fence, so its reports in flight stay good; a taker notes where its part grew, so a
        report made before counts nothing of what it got. The effect carries the moves only: each
        rank's new part is its old one with them applied, and ``reported`` names the ranks whose
        cursor is then at the end of what they kept (a leaver, a rank that ran dry)."""
        e.assignment += 1
        e.decided = record.offset
        a = e.assignment
        pool: list[tuple[int, Segment]] = []
        for donor in sorted(gives):
            h = e.holdings[donor]
            keep = h.held - gives[donor]
            h.sequence, tail = split_at(h.sequence, keep)
            pool.extend((donor, s) for s in tail)
            h.fence = h.assignment = a
            h.grown = []
        reported = tuple(
            r
            for r in sorted(set(gives) | set(gets))
            if r in e.holdings and e.holdings[r].remaining == 0
        )
        moves: list[Move] = []
        segments = [s for _, s in pool]
        owners = [d for d, _ in pool]
        for taker in sorted(gets):
            n = gets[taker]
            h = e.holding(taker)
            h.grown.append((a, h.held))
            while n > 0:
                start, size = segments[0]
                part = min(size, n)
                h.sequence.append((start, part))
                moves.append(Move(from_rank=owners[0], to_rank=taker, start=start, length=part))
                if part == size:
                    segments.pop(0)
                    owners.pop(0)
                else:
                    segments[0] = (start + part, size - part)
                n -= part
            h.sequence = normalized(h.sequence)
            h.assignment = a
        assert not segments, "every position given up is taken"
        ge.changes += 1
        effects.append(
            AssignmentChanged(
                group=g.name,
                epoch=e.number,
                assignment=a,
                version=g.version if version is None else version,
                cause=cause,
                detail=detail,
                change=ge.changes,
                moves=tuple(moves),
                reported=reported,
                offset=record.offset,
            )
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

    # -- weights ----------------------------------------------------------------------------

    def _weights(
        self, ge: GroupEpochs, e: Epoch, g: GroupState, members: tuple[int, ...] | list[int]
    ) -> dict[int, int]:
        """The plan's weights over ``members`` (integers): 1 each for an equal split, the
        plan's ratios (equal when no member has a positive one), or the reported rates."""
        if e.plan.split == "ratios":
            ratios = e.plan.partition_ratios or ()
            weights = integer_weights({r: ratios[r] for r in members})
            if any(weights.values()):
                return weights
            return {r: 1 for r in members}
        if e.plan.split == "throughput":
            return self._rate_weights(ge, g, members)
        return {r: 1 for r in members}

    def _rate_weights(
        self, ge: GroupEpochs, g: GroupState, ranks: tuple[int, ...] | list[int]
    ) -> dict[int, int]:
        """Each rank's reported rate as an integer weight; a rank that reported none counts
        as the mean of those that did (1 when none did)."""
        known = [ge.rates[r] for r in ranks if ge.rates.get(r, 0) > 0]
        mean = sum(known) / len(known) if known else 1.0
        return integer_weights({r: ge.rates.get(r) or mean for r in ranks})

    @staticmethod
    def _spare(e: Epoch, h: Holding) -> int:
        """What a move may take from a holding: its remaining work beyond the lookahead its
        sampler may already be reading."""
        return max(0, h.remaining - e.plan.lookahead)

    # -- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {name: self._groups[name].to_dict() for name in sorted(self._groups)}

    def restore(self, data: dict[str, Any]) -> None:
        self._groups = {name: GroupEpochs.from_dict(d) for name, d in data.items()}


def _plan_diff(old: EpochPlan, new: EpochPlan) -> str:
    a, b = msgspec.to_builtins(old), msgspec.to_builtins(new)
    return ", ".join(
        f"{k}: {_short(a[k])} (planned) vs {_short(b[k])}" for k in sorted(a) if a[k] != b[k]
    )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _left_text(e: Epoch) -> str:
    holders = [r for r, h in sorted(e.holdings.items()) if h.remaining]
    return (
        f"{e.unprocessed} of {e.plan.dataset_size} positions unprocessed, held by ranks "
        f"{ranks_text(holders)}"
    )


def _ranks_word(ranks: list[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks_text(ranks)}"


def _holds(e: Epoch, rank: int) -> bool:
    h = e.holdings.get(rank)
    return h is not None and h.remaining > 0


def _remaining_after(e: Epoch, rank: int, gives: dict[int, int], gets: dict[int, int]) -> int:
    h = e.holdings.get(rank)
    have = 0 if h is None else h.remaining
    return have - gives.get(rank, 0) + gets.get(rank, 0)
