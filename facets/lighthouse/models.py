"""The lighthouse facet's request and answer bodies (docs/torchft.md); its routes add them to
the OpenAPI document's components (``SCHEMA_TYPES`` in ``routes.py``)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from ...wire.protocol import request_body
from .effects import Settings, Verdict
from .inputs import HeartbeatInput, LostInput
from .messages import QuorumMember


class QuorumCall(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /lighthouse/quorum``: torchft's ``Quorum`` call as JSON (a standby carries its
    callers' calls to the leader so): the member, and how long it may wait."""

    member: QuorumMember
    timeout_s: Annotated[float, Meta(gt=0, le=3600)]


HeartbeatCall = request_body(
    HeartbeatInput,
    "HeartbeatCall",
    doc="""``POST /lighthouse/heartbeats``: replica groups that heartbeat (torchft's
    ``Heartbeat``, several at once).""",
    forbid_unknown_fields=True,
)
LostRequest = request_body(
    LostInput,
    "LostRequest",
    leave_out=("replica",),  # the path names it
    doc="``POST /lighthouse/replicas/{replica}/lost``: a launcher saw the replica group die.",
    forbid_unknown_fields=True,
)


class LostBody(Struct, kw_only=True):
    replica: str
    offset: int


class HeartbeatBody(Struct, kw_only=True):
    replicas: int


class PendingRequestBody(Struct, kw_only=True):
    replica_id: str
    step: int
    offset: int
    joined_ts: int


class LastQuorumBody(Struct, kw_only=True):
    quorum_id: int
    replica_ids: list[str]
    offset: int
    ts: int


class LighthouseBody(Struct, kw_only=True):
    """``GET /lighthouse``: the rule's settings, its answer now and what it stands on."""

    settings: Settings | None
    quorum_id: int
    status: str
    verdicts: list[Verdict]
    last: LastQuorumBody | None
    requests: list[PendingRequestBody]
    heartbeats: dict[str, int]
    lost: dict[str, int]


class QuorumList(Struct, kw_only=True):
    """``GET /lighthouse/quorums``: quorums as first decided under each id, oldest first."""

    quorums: list[dict]
    next_after: int | None
