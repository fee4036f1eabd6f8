"""The request and response bodies of the HTTP surface (docs/protocol.md), as msgspec Structs.

msgspec rather than pydantic because the agent endpoints carry the bulk of the traffic (tens of
thousands of heartbeats a second): decoding and validating a batch with msgspec costs a few
microseconds. The same Structs generate the OpenAPI schemas (``api.openapi``), so the document
and the validation cannot drift apart.

The agent's join, heartbeat, ack and exit events ignore unknown fields (a newer agent may send
more); the other events and the operator's bodies refuse them (``forbid_unknown_fields``), so a
misspelt option never silently falls back to its default (``GroupConfig.from_request``), but
``POST /proposals`` and ``POST /agents/deaths``, which ignore them.
A body that becomes one record is made from the record's input (``wire.protocol.request_body``
over ``wire.inputs``), which declares its fields once, with the wire's bounds.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import Struct

from ..coordinator.fold.config import GroupConfig
from ..wire import inputs
from ..wire.inputs import ShortText, Version
from ..wire.protocol import (
    MAX_EVENTS,
    AckEvent,
    AgentEvent,
    AgentEventsRequest,
    ExitEvent,
    GroupName,
    HeartbeatEvent,
    Incarnation,
    JoinEvent,
    LinksEvent,
    LooseEventsRequest,
    Rank,
    request_body,
)

__all__ = [
    "MAX_EVENTS",
    "AckEvent",
    "AgentEvent",
    "AgentEventsRequest",
    "ExitEvent",
    "GroupName",
    "HeartbeatEvent",
    "Incarnation",
    "JoinEvent",
    "LinksEvent",
    "LooseEventsRequest",
    "Rank",
    "ShortText",
    "Version",
]

# -- operator requests -------------------------------------------------------------------------


EndGroupRequest = request_body(
    inputs.GroupEndedInput,
    "EndGroupRequest",
    doc="``POST /groups/{group}/end``: why (shown to the ranks and kept in the log).",
    forbid_unknown_fields=True,
)


class InGroup(Struct, kw_only=True):
    """What a body names beside its record's payload: the group."""

    group: GroupName


class OfRank(InGroup, kw_only=True):
    """What a body names beside its record's payload: the group and the rank."""

    rank: Rank


CreateGroupRequest = request_body(
    GroupConfig,
    "CreateGroupRequest",
    envelope=InGroup,
    doc="``POST /groups``: a group's name and its configuration (docs/protocol.md), fixed for "
    "its run; an option left out takes its default.",
    forbid_unknown_fields=True,
)
ProposalRequest = request_body(
    inputs.ProposalInput,
    "ProposalRequest",
    envelope=InGroup,
    doc="""``POST /proposals``. ``op: reconfigure`` is one member's call of torch's
    ``ProcessGroup.reconfigure`` (docs/reconfigure.md): ``ranks`` are the members in the order of
    their handles, ``incarnations`` each member's incarnation in the same order, ``uuid`` the
    call's uuid, ``caller`` the member calling, ``call`` the id of this call (sent again with
    the same id, it is the same call), ``timeout_s`` how long it may wait to be admitted; only a
    reconfigure carries those fields, and it takes no idempotency key.""",
)
DeathReport = request_body(inputs.DeathReportedInput, "DeathReport", envelope=OfRank)


# The agent wire protocol's events are declared once, in ``wire.protocol``.


# -- responses ---------------------------------------------------------------------------------


class ErrorBody(Struct, kw_only=True):
    error: str
    detail: str


class EventResult(Struct, kw_only=True, omit_defaults=True):
    offset: int | None = None
    error: str | None = None
    detail: str | None = None


class AgentEventsAnswer(Struct, kw_only=True):
    term: int
    results: list[EventResult]


class StoreAddress(Struct, kw_only=True):
    host: str
    port: int


class UpdatesAnswerBody(Struct, kw_only=True):
    term: int
    updates: list[dict[str, Any]]
    next_after: int
    resync: bool
    store: StoreAddress | None = None
    #: the reader was past this log's head: the log was restored from an older copy
    restored: bool = False


class DeathAnswer(Struct, kw_only=True):
    offset: int
    term: int


class ViewBody(Struct, kw_only=True):
    group: str
    version: int
    active_ranks: list[int]
    rank_states: dict[str, str]
    healthy_set: list[int]
    cause: dict[str, Any]
    acked_ranks: list[int]
    dropped_ranks: list[int]
    offset: int
    ts: int
    checkpoint_rank: int | None = None


class ViewHistory(Struct, kw_only=True):
    group: str
    views: list[ViewBody]
    next_after_version: int | None


class ProposalBody(Struct, kw_only=True):
    id: int
    group: str
    op: str
    ranks: list[int]
    proposer: str | None
    idempotency_key: str | None
    status: Literal["pending", "applied", "applied_with_dropped_ranks", "rejected"]
    version: int | None
    reason: str
    dropped_ranks: list[int]
    offset: int
    resolved_offset: int | None
    #: a reconfigure's (absent from other proposals): its uuid, each member's incarnation in
    #: the order of ``ranks``, the members that called it so far and their call ids, its own
    #: admission timeout
    uuid: int | None = None
    incarnations: list[str] | None = None
    callers: list[int] | None = None
    calls: list[str | None] | None = None
    timeout_s: float | None = None


class GroupBody(Struct, kw_only=True):
    """``GET /groups/{group}``: the fold's view of a group (see docs/protocol.md)."""

    group: str
    #: the run's id: the offset of the group's ``group_created`` record (a name runs once)
    run: int
    #: where the run stands, in the one vocabulary of ``wire/life.py`` (``forming``,
    #: ``running``, ``shut down``, ``failed to form``, ``finished``, ``ended``, ``deleted``)
    status: str
    config: dict[str, Any]
    formation: dict[str, Any]
    view: ViewBody | None
    healthy_set: list[int]
    #: ranks in each state over the whole group (``exited``: OFFLINE after a clean exit), and
    #: what became of them (``online``, ``exited``, ``died``, ``not_joined``; ``wire/life.py``)
    rank_counts: dict[str, int]
    ranks: list[dict[str, Any]]
    pending_proposals: list[int]
    change_in_flight: dict[str, Any] | None
    #: the reason of the group's ``shutdown_with_save``, or None
    shutdown: str | None
    #: ``{reason, offset, deleted, finished}`` once the run is over (``finished``: every rank
    #: exited cleanly; else the operator ended it), else None
    ended: dict[str, Any] | None
    #: The last rank of this page when more follow (``?ranks_after=`` it); None on the last.
    next_ranks_after: int | None


class GroupLine(Struct, kw_only=True):
    """One group in ``GET /groups``."""

    group: str
    #: the run's id (the offset of the group's ``group_created`` record)
    run: int
    #: where the run stands (``wire/life.py``), as in ``GET /groups/{group}``
    status: str
    world_size: int
    #: the current view's version (0 before the group formed)
    version: int
    #: ``forming``, ``formed`` or ``failed``
    formation: str
    #: how many ranks are in each physical state
    states: dict[str, int]
    #: those counts and what became of the ranks, as in ``GET /groups/{group}``
    rank_counts: dict[str, int]
    #: how many ranks are in ``active_ranks``
    active: int
    failures: int
    #: the reason of the group's ``shutdown_with_save``, or None
    shutdown: str | None
    #: why the run is over (ended by ``POST /groups/{group}/end``, or finished), or None
    ended: str | None


class GroupList(Struct, kw_only=True):
    """``GET /groups``: every group, by name."""

    groups: list[GroupLine]


class EventRecord(Struct, kw_only=True):
    offset: int
    ts: int
    term: int
    kind: str
    group: str | None
    rank: int | None
    payload: dict[str, Any]


class RemovedRangeBody(Struct, kw_only=True):
    """Records retention removed: ``removed`` of the offsets ``first``..``last`` (both removed);
    the other offsets of that span are still in the log."""

    first: int
    last: int
    removed: int


class EventsPage(Struct, kw_only=True):
    events: list[EventRecord]
    next_after: int
    #: The removed ranges that overlap the offsets this page covers (after ``after``, up to
    #: ``next_after``, or to the head when the page is not full), so no missing offset is a
    #: silent hole.
    removed: list[RemovedRangeBody]


class Health(Struct, kw_only=True):
    status: Literal["ok", "unavailable"]
    role: Literal["leader", "standby"]
    term: int
    head: int
    fold_offset: int
    detail: str | None = None


class StoryEntry(Struct, kw_only=True):
    """One step of a rank's (or a refit's) story; events carry more fields (``state``, ``version``,
    ``active``, ``cause``, ``proposal``, ``reporter``, ...; see docs/console.md)."""

    offset: int
    ts: int
    record: str
    event: str
    reason: str


class StoryBody(Struct, kw_only=True):
    """``GET /groups/{group}/ranks/{rank}/story``: why a rank is where it is."""

    group: str
    rank: int
    until: int
    state: Literal["OFFLINE", "SYNCED", "HEALTHY"]
    incarnation: str | None
    rank_epoch: int
    exited: bool
    active: bool
    version: int
    heartbeats: int
    state_since: int | None
    membership_since: int | None
    summary: str
    entries: list[StoryEntry]
    omitted: dict[str, int]


#: Every Struct that appears in the OpenAPI document's components.
SCHEMA_TYPES: tuple[Any, ...] = (
    CreateGroupRequest,
    ProposalRequest,
    DeathReport,
    AgentEventsRequest,
    ErrorBody,
    AgentEventsAnswer,
    UpdatesAnswerBody,
    DeathAnswer,
    ViewBody,
    ViewHistory,
    ProposalBody,
    GroupBody,
    GroupList,
    EndGroupRequest,
    EventsPage,
    Health,
    StoryBody,
)


def encode(value: Any) -> bytes:
    return msgspec.json.encode(value)
