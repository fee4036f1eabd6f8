"""The lighthouse facet's request and answer bodies (docs/torchft.md); its routes add them to
the OpenAPI document's components (``SCHEMA_TYPES`` in ``routes.py``)."""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta, Struct

from .effects import Settings, Verdict
from .inputs import MAX_REASON_BYTES
from .messages import MAX_ID_BYTES, QuorumMember

ReplicaIds = Annotated[
    list[Annotated[str, Meta(min_length=1, max_length=MAX_ID_BYTES)]],
    Meta(min_length=1, max_length=4096),
]


class QuorumCall(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /lighthouse/quorum``: torchft's ``Quorum`` call as JSON (a standby carries its
    callers' calls to the leader so): the member, and how long it may wait."""

    member: QuorumMember
    timeout_s: Annotated[float, Meta(gt=0, le=3600)]


class HeartbeatCall(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /lighthouse/heartbeats``: replica groups that heartbeat (torchft's
    ``Heartbeat``, several at once)."""

    replicas: ReplicaIds


class LostRequest(Struct, kw_only=True, forbid_unknown_fields=True):
    """``POST /lighthouse/replicas/{replica}/lost``: a launcher saw the replica group die."""

    reason: Annotated[str, Meta(min_length=1, max_length=MAX_REASON_BYTES // 4)]


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
