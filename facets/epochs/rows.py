"""The projection rows of the epochs facet (docs/data.md), keyed ``(kind, group, seq)``:

==============  =========  ==========================================================
kind            seq        document
==============  =========  ==========================================================
``epoch``       epoch      an epoch's plan, over the view it was made for (``epoch_planned``)
``assignment``  change     one decision about a group's epochs: the first split (every
                           rank's part), or the moves alone (each rank's part after it is
                           its part before with the moves applied, see docs/data.md)
``epoch_end``   epoch      every position reported processed, by rank (``epoch_completed``)
==============  =========  ==========================================================
"""

from __future__ import annotations

from ...coordinator.fold.projections import to_doc
from ...eventlog import ProjectionRow
from .effects import (
    AssignmentChanged,
    EpochCompleted,
    EpochPlanned,
)

PROJECTION_KINDS = ("epoch", "assignment", "epoch_end")


def _planned(effect: EpochPlanned) -> list[ProjectionRow]:
    plan = {k: v for k, v in to_doc(effect).items() if k != "ranges"}
    return [
        ProjectionRow("epoch", effect.group, effect.epoch, plan),
        ProjectionRow("assignment", effect.group, effect.change, to_doc(effect)),
    ]


def _changed(effect: AssignmentChanged) -> list[ProjectionRow]:
    return [ProjectionRow("assignment", effect.group, effect.change, to_doc(effect))]


def _completed(effect: EpochCompleted) -> list[ProjectionRow]:
    return [ProjectionRow("epoch_end", effect.group, effect.epoch, to_doc(effect))]


ROWS = {EpochPlanned: _planned, AssignmentChanged: _changed, EpochCompleted: _completed}
