"""The projection rows of the lighthouse facet (docs/torchft.md), filed under the group name
``lighthouse``:

=====================  ==========  ==========================================================
kind                   seq         document
=====================  ==========  ==========================================================
``lighthouse_quorum``  quorum id   a quorum as first decided under its id: the participants
                                   (each with its step and request), the rule's reason and
                                   every replica group's verdict
=====================  ==========  ==========================================================

An unchanged quorum is decided again at every step its members take; those decisions are in
the log (``replay`` and ``explain --lighthouse`` tell them) but write no row.
"""

from __future__ import annotations

from ...coordinator.fold.projections import to_doc
from ...eventlog import ProjectionRow
from .effects import QuorumDecided

PROJECTION_KINDS = ("lighthouse_quorum",)
#: the group name the lighthouse's rows are filed under
ROWS_GROUP = "lighthouse"


def _quorum(effect: QuorumDecided) -> list[ProjectionRow]:
    if not effect.changed:
        return []
    return [ProjectionRow("lighthouse_quorum", ROWS_GROUP, effect.quorum_id, to_doc(effect))]


ROWS = {QuorumDecided: _quorum}
