"""The refits facet's part of the agent protocol (docs/refit.md, docs/protocol.md), declared
here, by its owner: the events a worker sends (a join, a bootstrap, a transfer, a transfer's
status) and the updates it receives (the refit's epochs and transfers, an admitted epoch's
bootstrap).

The server side reads them through the facet's declaration (``plugin.py``: the readers of a
composition that holds the facet decode them); the worker side through its own list of facets
(``agent/facets.py``: the agent's poller, the relay and the simulated hosts decode them), and
names the facet's worker part (``worker.py``), which follows them for the agent. Pure,
importing only ``wire``: the agent imports it, never the facet's fold.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from msgspec import Meta

from ...wire.facets import WorkerPart
from ...wire.protocol import AgentEventBase
from ...wire.updates import Update

# -- events (POST /agents/events) ------------------------------------------------------------

#: A refit's name (``POST /refits``), and a plan digest: sha256 in lowercase hex.
RefitName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$")]
Digest = Annotated[str, Meta(pattern=r"^[0-9a-f]{64}$")]
RefitEpoch = Annotated[int, Meta(ge=1, le=2**62)]
#: A transfer's key: printable ASCII without spaces.
TransferKey = Annotated[str, Meta(pattern=r"^[\x21-\x7e]{1,128}$")]
#: A bootstrap is flat: the data plane's rendezvous (a store address, a prefix, an NCCL unique
#: id in hex), at most 16 values, each short (the fold also bounds its encoded size).
BootstrapValue = (
    Annotated[str, Meta(max_length=1024)] | Annotated[int, Meta(ge=-(2**63), le=2**63 - 1)]
)
FlatBootstrap = Annotated[
    dict[Annotated[str, Meta(max_length=64)], BootstrapValue], Meta(max_length=16)
]


class RefitJoinEvent(
    AgentEventBase, tag="refit_join", kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """This worker takes ``slot`` of its group's side of ``refit`` in ``epoch``, holding the
    plan whose digest is ``digest`` (``wire.refit.ReshardPlan.digest``). Publisher slot 0 may
    offer the epoch's ``bootstrap`` with its join: the fold publishes it to the members in the
    step that admits the epoch, saving the separate ``refit_bootstrap`` round trip."""

    refit: RefitName
    epoch: RefitEpoch
    slot: Annotated[int, Meta(ge=0, le=65_535)]
    digest: Digest
    bootstrap: FlatBootstrap | None = None


class RefitBootstrapEvent(
    AgentEventBase,
    tag="refit_bootstrap",
    kw_only=True,
    omit_defaults=True,
    forbid_unknown_fields=True,
):
    """Refit rank 0 publishes the data plane's rendezvous of an admitted epoch."""

    refit: RefitName
    epoch: RefitEpoch
    bootstrap: FlatBootstrap


class TransferEvent(
    AgentEventBase, tag="transfer", kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """Start (or, after a failure, retry) the transfer ``key`` in the admitted ``epoch``."""

    refit: RefitName
    epoch: RefitEpoch
    key: TransferKey


class TransferStatusEvent(
    AgentEventBase,
    tag="transfer_status",
    kw_only=True,
    omit_defaults=True,
    forbid_unknown_fields=True,
):
    """This member's outcome of ``attempt`` of transfer ``transfer``."""

    refit: RefitName
    epoch: RefitEpoch
    transfer: Annotated[int, Meta(ge=1, le=2**62)]
    attempt: Annotated[int, Meta(ge=1, le=2**62)]
    status: Annotated[str, Meta(pattern="^(done|failed)$")]
    detail: Annotated[str, Meta(max_length=1000)] = ""


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
