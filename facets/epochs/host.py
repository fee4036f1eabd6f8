"""What the epochs facet's effects ask of the host, and what a resync sends of it.

The plan, each later decision's moves and the epoch's end go to the group's journal, once; a
rank's whole part (``data_assignment``) goes to its own journal at the plan, and in a resync,
where it stands for every decision before it.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...coordinator.fold.machine import Coordinator
from ...coordinator.host.facets import FacetHost
from ...coordinator.host.journal import Update
from ...coordinator.host.reads import Reads
from ...coordinator.host.ready import HostState, Ready
from .effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
    PartSent,
)
from .story import EpochStory, epoch_label
from .updates import (
    data_assignment_update,
    data_assignment_updates,
    data_moves_update,
    epoch_complete_update,
    epoch_plan_update,
    part_sent_update,
)


def _planned(state: HostState, effect: EpochPlanned, ready: Ready) -> None:
    """A new epoch: its plan replaces the last one's (and its end) in a resync; each rank's
    first part goes to its own journal."""
    update = epoch_plan_update(effect)
    latest = state.latest.setdefault(effect.group, {})
    latest.pop("epoch_end", None)
    latest["epoch"] = update
    ready.updates.append((effect.group, None, update))
    for part in data_assignment_updates(effect):
        ready.updates.append((effect.group, part.rank, part))


def _moves(state: HostState, effect: AssignmentChanged, ready: Ready) -> None:
    """A later decision: its moves, once, on the group's journal (every agent applies them
    to its own part; a resync sends the parts instead)."""
    ready.updates.append((effect.group, None, data_moves_update(effect)))


def _part_sent(state: HostState, effect: PartSent, ready: Ready) -> None:
    """A new incarnation's part, whole, on its own journal (after the decisions it may
    read first: the part stands for them and for its predecessors' reports)."""
    ready.updates.append((effect.group, effect.rank, part_sent_update(effect)))


def _completed(state: HostState, effect: EpochCompleted, ready: Ready) -> None:
    update = epoch_complete_update(effect)
    state.latest.setdefault(effect.group, {})["epoch_end"] = update
    ready.updates.append((effect.group, None, update))


def resync(machine: Coordinator, group: str, ranks: Sequence[int]) -> list[Update]:
    """Each of ``ranks``' whole part of ``group``'s open (or last) epoch, as of its latest
    decision (a rank that holds nothing gets an empty part: what it held is no longer its)."""
    e = machine.facet("epochs").epoch(group)
    if e is None:
        return []
    out = []
    for rank in ranks:
        h = e.holdings.get(rank)
        out.append(
            data_assignment_update(
                group=group,
                rank=rank,
                epoch=e.number,
                assignment=e.assignment,
                processed=0 if h is None else h.processed,
                remaining=[] if h is None else h.remaining_segments(),
                offset=e.decided,
            )
        )
    return out


def _readers_need(reads: Reads, group: str) -> str | None:
    """Once a group has an epoch plan, its readers must apply its ``data_moves``."""
    return "reads epoch plans" if reads.facet("epochs").planned(group) else None


HOST = FacetHost(
    carry={
        EpochPlanned: _planned,
        AssignmentChanged: _moves,
        EpochCompleted: _completed,
        PartSent: _part_sent,
    },
    resync=resync,
    story=EpochStory,
    readers_need=_readers_need,
    labels=dict.fromkeys(("epoch_planned", "assignment_changed", "epoch_completed"), epoch_label),
)
