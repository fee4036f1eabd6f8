"""The epochs facet's agent updates (docs/data.md, docs/protocol.md): each a Struct of
``wire.updates``.

The plan, each later decision's moves and the epoch's end go to the group's journal, once; a
rank's whole part (``data_assignment``) goes to its own journal at the plan, and in a resync
(``host.py``), where it stands for every decision before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...wire.updates import update_from
from .effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
    PartSent,
)
from .protocol import DataAssignmentUpdate, DataMovesUpdate, EpochCompleteUpdate, EpochPlanUpdate


def epoch_plan_update(effect: EpochPlanned) -> EpochPlanUpdate:
    """The plan, every field of it but a ratios split's ``partition_ratios`` (the log's)."""
    plan = effect.plan
    return EpochPlanUpdate(
        offset=effect.offset,
        group=effect.group,
        version=effect.version,
        epoch=plan["epoch"],
        dataset_size=plan["dataset_size"],
        seed=plan["seed"],
        shuffle=plan["shuffle"],
        split=plan["split"],
        grain=plan["grain"],
        lookahead=plan["lookahead"],
        reclaim=plan["reclaim"],
    )


def data_assignment_update(
    *,
    group: str,
    rank: int,
    epoch: int,
    assignment: int,
    processed: int,
    remaining: Sequence[tuple[int, int]],
    offset: int,
) -> DataAssignmentUpdate:
    """A rank's whole part as of decision ``assignment`` of the epoch: its cursor and the
    segments it still holds."""
    return DataAssignmentUpdate(
        offset=offset,
        group=group,
        rank=rank,
        epoch=epoch,
        assignment=assignment,
        processed=processed,
        remaining=tuple(remaining),
    )


def data_assignment_updates(effect: EpochPlanned) -> list[DataAssignmentUpdate]:
    """The first split: one update per rank that holds a part."""
    return [
        data_assignment_update(
            group=effect.group,
            rank=r.rank,
            epoch=effect.epoch,
            assignment=effect.assignment,
            processed=r.processed,
            remaining=r.remaining,
            offset=effect.offset,
        )
        for r in effect.ranges
    ]


def part_sent_update(effect: PartSent) -> DataAssignmentUpdate:
    """A new incarnation's part, whole (``PartSent`` carries every field of it)."""
    return update_from(DataAssignmentUpdate, effect)


def data_moves_update(effect: AssignmentChanged) -> DataMovesUpdate:
    """A later decision, once for the whole group: the moves, ``[from_rank, to_rank, start,
    length]`` in the order they apply, and the ranks whose cursor is then the end of what they
    kept (``reported``; ``agent.data`` applies them to its own part)."""
    return DataMovesUpdate(
        offset=effect.offset,
        group=effect.group,
        epoch=effect.epoch,
        assignment=effect.assignment,
        moves=tuple((m.from_rank, m.to_rank, m.start, m.length) for m in effect.moves),
        reported=effect.reported,
    )


def epoch_complete_update(effect: EpochCompleted) -> EpochCompleteUpdate:
    return update_from(EpochCompleteUpdate, effect)
