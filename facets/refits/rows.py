"""The projection rows of the refits facet (docs/refit.md), keyed ``(kind, refit, seq)`` (a
refit's rows are filed under its name, where membership's have the group's):

===============  =========  =========================================================
kind             seq        document
===============  =========  =========================================================
``refit``        0          a refit's definition (``refit_created``)
``refit_epoch``  epoch      a refit epoch, rewritten as its status moves (waiting, admitted
                            with its members and lanes, timed out with the missing slots);
                            never the bootstrap, which only the admitted members receive
``transfer``     transfer   a transfer, rewritten per attempt and outcome (running, failed,
                            completed: final)
===============  =========  =========================================================
"""

from __future__ import annotations

from ...coordinator.fold.projections import to_doc
from ...eventlog import ProjectionRow
from .effects import (
    RefitCreated,
    RefitEpochChanged,
    TransferChanged,
)

PROJECTION_KINDS = ("refit", "refit_epoch", "transfer")


def _created(effect: RefitCreated) -> list[ProjectionRow]:
    return [ProjectionRow("refit", effect.refit, 0, to_doc(effect))]


def _epoch(effect: RefitEpochChanged) -> list[ProjectionRow]:
    """The row says why the epoch began in words (``cause``), as it always did; ``lost``,
    the same member as a value, is for the workers' update only (so a log written before it
    replays with the same rows)."""
    doc = to_doc(effect)
    doc.pop("lost", None)
    return [ProjectionRow("refit_epoch", effect.refit, effect.epoch, doc)]


def _transfer(effect: TransferChanged) -> list[ProjectionRow]:
    return [ProjectionRow("transfer", effect.refit, effect.transfer, to_doc(effect))]


ROWS = {RefitCreated: _created, RefitEpochChanged: _epoch, TransferChanged: _transfer}
