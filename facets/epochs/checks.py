"""The epochs facet's checks: which inputs it refuses, with which code, and which plan repeats
an earlier one. They read the epochs (``state.py``) and decide nothing; the steps are
``fold.py``'s, and the module docstring there states the rules these checks keep.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.fencing import online_rank_refusal
from ...coordinator.fold.reasons import ranks_text
from ...coordinator.fold.state import FAILED, GroupState
from ...wire.codes import (
    EPOCH_CONFLICT,
    GROUP_FAILED,
    GROUP_NOT_FORMED,
    INVALID_EVENT,
    STALE_ASSIGNMENT,
    UNKNOWN_EPOCH,
    UNKNOWN_GROUP,
)
from .inputs import EpochPlan, ProgressInput, decode, plan_problem, progress_problem
from .state import Epoch, GroupEpochs


class EpochChecks:
    """``Epochs.refusal`` and ``Epochs.repeat_of`` (``coordinator.fold.facets.Facet``), over the
    facet's epochs by group (the same dict the fold steps, read only here)."""

    def __init__(self, groups: dict[str, GroupEpochs]) -> None:
        self._groups = groups

    def epoch(self, group: str) -> Epoch | None:
        """The group's open or last epoch."""
        ge = self._groups.get(group)
        return None if ge is None else ge.current

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
