"""The refits facet's part of the agent protocol (docs/refit.md, docs/protocol.md), declared
here, by its owner: the events a worker sends (a join, a bootstrap, a transfer, a transfer's
status) and the updates it receives (the refit's epochs and transfers, an admitted epoch's
bootstrap).

The server side reads them through the facet's declaration (``plugin.py``: the readers of a
composition that holds the facet decode them); the worker side through its own list of facets
(``agent/facets.py``: the agent's poller, the relay and the simulated hosts decode them), and
names the facet's worker part (``worker.py``), which follows them for the agent. Pure,
importing only ``wire`` and the facet's inputs (``inputs.py``, which declares the events'
fields): the agent imports it, never the facet's fold.
"""

from __future__ import annotations

from typing import Any, ClassVar

from ...wire.facets import WorkerPart
from ...wire.protocol import AgentEventBase, agent_event
from ...wire.updates import Update
from .inputs import RefitBootstrapInput, RefitJoinInput, TransferInput, TransferStatusInput

# -- events (POST /agents/events) ------------------------------------------------------------

# Each made from its input, which declares its fields (``inputs.py``); every field not declared
# is refused.
RefitJoinEvent = agent_event(RefitJoinInput, forbid_unknown_fields=True)
RefitBootstrapEvent = agent_event(RefitBootstrapInput, forbid_unknown_fields=True)
TransferEvent = agent_event(TransferInput, forbid_unknown_fields=True)
TransferStatusEvent = agent_event(TransferStatusInput, forbid_unknown_fields=True)


# -- updates (GET /agents/updates) ----------------------------------------------------------

#: Who receives an update of the refits (its audience, docs/protocol.md).
REFIT_GROUPS = "every rank of the refit's publisher and subscriber groups"
REFIT_MEMBERS = "the refit epoch's admitted members only"


class RefitEpochUpdate(Update, frozen=True, kw_only=True, tag="refit_epoch"):
    """A refit's epoch, whole, each time its ``status`` changes: ``waiting`` (slots may join
    until ``deadline_ts``), ``admitted`` (with the plan's ``digest``, the data plane's
    ``lanes`` and each side's ranks by slot), ``timed_out`` (``missing`` names the slots that
    never joined). ``cause`` says why the epoch began; ``lost`` names the member whose loss
    began it (``[side, slot]``), if one did. ``groups``: the publisher and the subscriber
    group."""

    audience: ClassVar[str] = REFIT_GROUPS

    refit: str
    groups: tuple[str, str]
    epoch: int
    status: str
    cause: str
    deadline_ts: int | None
    digest: str | None
    lanes: int
    publisher_ranks: tuple[int, ...]
    subscriber_ranks: tuple[int, ...]
    missing: tuple[str, ...]
    lost: tuple[str, int] | None = None


class TransferUpdate(Update, frozen=True, kw_only=True, tag="transfer"):
    """A transfer, whole, each time it changes: ``running`` (``attempt`` in refit epoch
    ``epoch``, due by ``deadline_ts``), ``completed`` (final) or ``failed`` (``detail`` says
    who or what)."""

    audience: ClassVar[str] = REFIT_GROUPS

    refit: str
    groups: tuple[str, str]
    transfer: int
    key: str
    attempt: int
    epoch: int
    status: str
    detail: str
    deadline_ts: int | None


class RefitBootstrapUpdate(Update, frozen=True, kw_only=True, tag="refit_bootstrap"):
    """The data plane's rendezvous of refit epoch ``epoch`` (a flat object)."""

    audience: ClassVar[str] = REFIT_MEMBERS

    refit: str
    epoch: int
    bootstrap: dict[str, Any]


#: The updates a worker of a refit receives (the server's readers, and the worker's, decode them).
UPDATES: tuple[type[Update], ...] = (RefitEpochUpdate, TransferUpdate, RefitBootstrapUpdate)
#: The facet's worker part (``worker.py``): it follows these updates, alone sends these events
#: and is given their answers (a caller of ``Agent.send_event`` may not send them), and offers
#: the Agent ``agent.refit(name)``, ``agent.refits`` and ``agent.create_refit(...)``.
WORKER = WorkerPart(module="worker", offers=("refit", "refits", "create_refit"))
#: The events a worker of a refit sends.
EVENTS: tuple[type[AgentEventBase], ...] = (
    RefitJoinEvent,
    RefitBootstrapEvent,
    TransferEvent,
    TransferStatusEvent,
)
