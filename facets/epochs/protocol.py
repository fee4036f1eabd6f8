"""The epochs facet's part of the agent protocol (docs/data.md, docs/protocol.md), declared here,
by its owner: the event a rank sends (``progress``: how far it has read its part) and the
updates it receives (the epoch's plan, a rank's whole part, each later decision's moves, the
epoch's end). How a ``data_moves`` update applies to a rank's part is ``cursor.py``.

The server side reads them through the facet's declaration (``plugin.py``); the worker side
through its own list of facets (``agent/facets.py``), and the facet's worker part (``worker/``,
named here) follows the updates and reports ``progress``. Pure, importing only ``wire`` and
the facet's inputs (``inputs.py``, which declares the event's fields): the agent imports it,
never the facet's fold.
"""

from __future__ import annotations

from typing import ClassVar

from ...wire.facets import WorkerPart
from ...wire.protocol import AgentEventBase, agent_event
from ...wire.updates import OWN_RANK, Update
from .inputs import ProgressInput

# -- events (POST /agents/events) ------------------------------------------------------------

#: How far this rank has read its part of the open epoch: made from the ``progress`` input,
#: which declares its fields (``inputs.ProgressInput``). A report: the newest says it all
#: (``AgentEventBase.report``), so the agent sends the newest only.
ProgressEvent = agent_event(ProgressInput, forbid_unknown_fields=True, report=True)


# -- updates (GET /agents/updates) ----------------------------------------------------------


class EpochPlanUpdate(Update, frozen=True, kw_only=True, tag="epoch_plan"):
    """Epoch ``epoch`` was planned over view ``version``: the plan, every field explicit (a
    ratios split's ``partition_ratios`` stay in the log)."""

    group: str
    version: int
    epoch: int
    dataset_size: int
    seed: int
    shuffle: bool
    split: str
    grain: int
    lookahead: int
    reclaim: bool


class DataAssignmentUpdate(Update, frozen=True, kw_only=True, tag="data_assignment"):
    """A rank's whole part of ``epoch`` as of decision ``assignment``: how many positions of its
    sequence were reported ``processed``, and the ``(start, length)`` segments it still holds,
    in reading order. Sent at the plan, in a resync and to a new incarnation."""

    audience: ClassVar[str] = OWN_RANK

    group: str
    rank: int
    epoch: int
    assignment: int
    processed: int
    remaining: tuple[tuple[int, int], ...]


class DataMovesUpdate(Update, frozen=True, kw_only=True, tag="data_moves"):
    """Decision ``assignment`` of ``epoch``, once for the group: ``moves``
    (``[from_rank, to_rank, start, length]``, in the order they apply) and ``reported``, the
    ranks whose cursor is then the end of what they kept (``cursor.apply_moves``)."""

    group: str
    epoch: int
    assignment: int
    moves: tuple[tuple[int, int, int, int], ...]
    reported: tuple[int, ...]


class EpochCompleteUpdate(Update, frozen=True, kw_only=True, tag="epoch_complete"):
    """Every position of ``epoch`` was reported processed, exactly once."""

    group: str
    epoch: int


#: The updates a rank of a group with epochs receives.
UPDATES: tuple[type[Update], ...] = (
    EpochPlanUpdate,
    DataAssignmentUpdate,
    DataMovesUpdate,
    EpochCompleteUpdate,
)
#: The event a rank sends.
EVENTS: tuple[type[AgentEventBase], ...] = (ProgressEvent,)
#: The facet's worker part (``worker/``): it follows these updates, alone sends the event and is
#: given its answers, and offers the Agent ``agent.data`` (this rank's epochs, which
#: ``ElasticSampler`` reads) and ``agent.plan_epoch(...)``.
WORKER = WorkerPart(module="worker", offers=("data", "plan_epoch"))
