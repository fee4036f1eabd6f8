"""The request and response bodies of the HTTP surface (docs/protocol.md), as msgspec Structs.

msgspec rather than pydantic because the agent endpoints carry the bulk of the traffic (tens of
thousands of heartbeats a second): decoding and validating a batch with msgspec costs a few
microseconds. The same Structs generate the OpenAPI schemas (``api.openapi``), so the document
and the validation cannot drift apart.

Requests ignore unknown fields (a newer agent may send more), except ``POST /groups``, where a
misspelt option must not silently fall back to its default (``GroupConfig.from_request``).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

# Patterns are read by Python (msgspec validates with them) and by JSON Schema tools (ECMA-262)
# alike, so they keep to what both read the same way: ASCII classes, not \d or \s, and
# ``$(?!\n)``, since Python's ``$`` also matches before a final newline.
GroupName = Annotated[
    str,
    Meta(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$(?!\n)",
        description="1-64 of A-Z a-z 0-9 . _ -, starting with a letter or digit",
    ),
]
Rank = Annotated[int, Meta(ge=0, le=65_535)]
Incarnation = Annotated[str, Meta(min_length=1, max_length=128)]
Version = Annotated[int, Meta(ge=0)]
Seconds = Annotated[float, Meta(ge=0, le=604_800)]
#: A timeout: more than zero seconds, at most a week.
Timeout = Annotated[float, Meta(gt=0, le=604_800)]
ShortText = Annotated[str, Meta(max_length=256)]

#: A failure budget as a percentage of the group, more than 0 and at most 100: ``"25%"``.
PERCENT = r"^ *(0*[1-9][0-9]?(\.[0-9]+)?|0*100(\.0+)?|0+\.[0-9]*[1-9][0-9]*) *% *$(?!\n)"

#: The most events one ``POST /agents/events`` may carry.
MAX_EVENTS = 4096


# -- operator requests -------------------------------------------------------------------------


class CreateGroupRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    group: GroupName
    world_size: Annotated[int, Meta(ge=1, le=65_536)]
    heartbeat_timeout_s: Timeout | UnsetType = UNSET
    ack_timeout_s: Timeout | UnsetType = UNSET
    admission_timeout_s: Timeout | UnsetType = UNSET
    formation_timeout_s: Timeout | UnsetType = UNSET
    reconcile_window_s: Seconds | UnsetType = UNSET
    min_ranks: Annotated[int, Meta(ge=1)] | None | UnsetType = UNSET
    min_active: Annotated[int, Meta(ge=1)] | UnsetType = UNSET
    max_failure: (
        Annotated[int, Meta(ge=1)] | Annotated[str, Meta(pattern=PERCENT)] | None | UnsetType
    ) = UNSET
    auto_deactivate_on_failure: bool | UnsetType = UNSET
    backend: Literal["gloo", "nccl"] | UnsetType = UNSET


class ProposalRequest(Struct, kw_only=True):
    group: GroupName
    op: Literal["activate", "deactivate"]
    ranks: Annotated[list[Rank], Meta(min_length=1, max_length=65_536)]
    proposer: ShortText | None = None
    idempotency_key: Annotated[str, Meta(min_length=1, max_length=256)] | None = None


class DeathReport(Struct, kw_only=True):
    group: GroupName
    rank: Rank
    incarnation: Incarnation | None = None
    reporter: ShortText | None = None


# -- the agent wire protocol -------------------------------------------------------------------


class _AgentEvent(Struct, kw_only=True, tag_field="type", omit_defaults=True):
    group: GroupName
    rank: Rank
    incarnation: Incarnation
    #: Optional per-event agent token, so that one host can batch the events of all its ranks
    #: while each event is still authenticated for its own rank.
    token: Annotated[str, Meta(max_length=512)] | None = None

    @property
    def type_name(self) -> str:
        """The wire ``type`` (the record kind it becomes)."""
        return self.__struct_config__.tag  # type: ignore[return-value]


class JoinEvent(_AgentEvent, tag="join", kw_only=True, omit_defaults=True):
    host: ShortText | None = None
    pid: Annotated[int, Meta(ge=0)] | None = None


class HeartbeatEvent(_AgentEvent, tag="heartbeat", kw_only=True, omit_defaults=True):
    version: Version | None = None


class LinksEvent(_AgentEvent, tag="links", kw_only=True, omit_defaults=True):
    peers: dict[Annotated[str, Meta(pattern=r"^(0|[1-9][0-9]{0,4})$(?!\n)")], Literal["up", "down"]]
    self_ready: bool
    failed_ranks_hint: Annotated[list[Rank], Meta(max_length=65_536)] | None = None
    version: Version | None = None


class AckEvent(_AgentEvent, tag="ack", kw_only=True, omit_defaults=True):
    version: Version


class ExitEvent(_AgentEvent, tag="exit", kw_only=True, omit_defaults=True):
    pass


AgentEvent = JoinEvent | HeartbeatEvent | LinksEvent | AckEvent | ExitEvent


class AgentEventsRequest(Struct, kw_only=True):
    """What the OpenAPI document advertises for ``POST /agents/events``."""

    events: Annotated[list[AgentEvent], Meta(max_length=MAX_EVENTS)]


class LooseEventsRequest(Struct, kw_only=True):
    """What the server decodes first: a list of objects, each then validated on its own, so
    that one bad event gets its own ``invalid_event`` result instead of failing the batch."""

    events: Annotated[list[dict[str, Any]], Meta(max_length=MAX_EVENTS)]


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


class GroupBody(Struct, kw_only=True):
    """``GET /groups/{group}``: the fold's view of a group (see docs/protocol.md)."""

    group: str
    config: dict[str, Any]
    formation: dict[str, Any]
    view: ViewBody | None
    healthy_set: list[int]
    ranks: list[dict[str, Any]]
    pending_proposals: list[int]
    change_in_flight: dict[str, Any] | None
    #: The last rank of this page when more follow (``?ranks_after=`` it); None on the last.
    next_ranks_after: int | None


class EventRecord(Struct, kw_only=True):
    offset: int
    ts: int
    term: int
    kind: str
    group: str | None
    rank: int | None
    payload: dict[str, Any]


class EventsPage(Struct, kw_only=True):
    events: list[EventRecord]
    next_after: int


class Health(Struct, kw_only=True):
    status: Literal["ok", "unavailable"]
    role: Literal["leader", "standby"]
    term: int
    head: int
    fold_offset: int
    detail: str | None = None


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
    EventsPage,
    Health,
)


def encode(value: Any) -> bytes:
    return msgspec.json.encode(value)
