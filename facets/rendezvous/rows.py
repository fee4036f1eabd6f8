"""The projection rows of the rendezvous facet (docs/torchrun.md), filed under the job's id
where membership's are under the group's:

================  =========  ===========================================================
kind              seq        document
================  =========  ===========================================================
``rdzv_job``      0          the job's settings, fixed by its first join (``JobCreated``)
``rdzv_round``    round      a formed round: its nodes in rank order, its store, the reason
``rdzv_node``     seq        a node joined (waits for a round) or left (and how), each with
                             the fold's reason (``seq``: the job's node events, counted)
``rdzv_closed``   0          who closed the job and why
================  =========  ===========================================================

``replay`` re-derives every one and compares it with the stored row, like a view's.
"""

from __future__ import annotations

from ...coordinator.fold.projections import to_doc
from ...eventlog import ProjectionRow
from .effects import (
    JobClosed,
    JobCreated,
    NodeJoined,
    NodeLeft,
    RoundFormed,
)

PROJECTION_KINDS = ("rdzv_job", "rdzv_round", "rdzv_node", "rdzv_closed")


def _created(effect: JobCreated) -> list[ProjectionRow]:
    return [ProjectionRow("rdzv_job", effect.job, 0, to_doc(effect))]


def _round(effect: RoundFormed) -> list[ProjectionRow]:
    return [ProjectionRow("rdzv_round", effect.job, effect.round, to_doc(effect))]


def _node(effect: NodeJoined | NodeLeft) -> list[ProjectionRow]:
    return [ProjectionRow("rdzv_node", effect.job, effect.seq, to_doc(effect))]


def _closed(effect: JobClosed) -> list[ProjectionRow]:
    return [ProjectionRow("rdzv_closed", effect.job, 0, to_doc(effect))]


ROWS = {
    JobCreated: _created,
    RoundFormed: _round,
    NodeJoined: _node,
    NodeLeft: _node,
    JobClosed: _closed,
}
