"""The rendezvous facet's request and answer bodies (docs/protocol.md, "torchrun's
rendezvous"); its routes add them to the OpenAPI document's components (``SCHEMA_TYPES`` in
``routes.py``). The bounds are the fold's (``fold.py``), so a body that decodes is refused by
the fold only for what depends on the job (its settings, whether it is closed, who is in it)."""

from __future__ import annotations

from typing import Any

from msgspec import Struct

from ...api.models import StoryEntry
from ...wire.protocol import request_body
from .inputs import JoinInput, KeepaliveInput, LeaveInput

JoinRequest = request_body(
    JoinInput,
    "JoinRequest",
    leave_out=("job",),
    doc="""``POST /rendezvous/{job}/join``: ``node`` waits for the next round of ``job``; it offers
    a fresh store at ``host``:``store_port`` (the round's store if it is rank 0) and runs
    ``local_world_size`` workers (0: it does not know). The settings must be the job's (its first join fixes them).""",
    forbid_unknown_fields=True,
)
NodeRequest = request_body(
    KeepaliveInput,
    "NodeRequest",
    leave_out=("job",),
    doc="``POST /rendezvous/{job}/keepalive``: ``node`` is alive.",
    forbid_unknown_fields=True,
)
#: a leave's and a close's (their inputs carry the same fields)
LeaveRequest = request_body(
    LeaveInput,
    "LeaveRequest",
    leave_out=("job",),
    doc="""``POST /rendezvous/{job}/leave`` (the node leaves) and ``/close`` (the job ends for
    every node): who, and why (kept in the log).""",
    forbid_unknown_fields=True,
)


class RoundNodeBody(Struct, kw_only=True):
    node: str
    rank: int
    host: str
    store_port: int
    local_world_size: int
    cause: str
    restart_count: int


class WaitingBody(Struct, kw_only=True):
    node: str
    cause: str
    restart_count: int
    offset: int
    joined_ts: int
    join_deadline_ts: int


class LeftBody(Struct, kw_only=True):
    node: str
    reason: str


class ClosedBody(Struct, kw_only=True):
    node: str
    reason: str
    offset: int


class SettingsBody(Struct, kw_only=True):
    min_nodes: int
    max_nodes: int
    last_call_s: float
    join_timeout_s: float
    keepalive_timeout_s: float


class RendezvousBody(Struct, kw_only=True):
    """A job's rendezvous: its latest ``round`` and its ``nodes`` in rank order (rank 0's
    ``host``:``store_port`` is the round's store), the nodes still part of it (``live``), who
    waits for the next round, the last call's end (``last_call_ts``, or null), what a member's
    ``num_nodes_waiting()`` answers, who left and why, whether it is closed, and ``version``
    (``GET ...?after=VERSION`` waits past it). A join's answer adds ``offset`` (its record's)."""

    job: str
    settings: SettingsBody
    round: int
    formed_ts: int | None
    nodes: list[RoundNodeBody]
    world_size: int
    live: list[str]
    waiting: list[WaitingBody]
    last_call_ts: int | None
    nodes_waiting: int
    left: list[LeftBody]
    closed: ClosedBody | None
    version: int
    offset: int | None = None


class RendezvousList(Struct, kw_only=True):
    """``GET /rendezvous``: every job, with its round and whether it is closed."""

    rendezvous: list[dict[str, Any]]


class OffsetBody(Struct, kw_only=True):
    """The offset of the record appended."""

    offset: int


class RoundsBody(Struct, kw_only=True):
    """``GET /rendezvous/{job}/rounds``: formed rounds in order (``rdzv_round`` rows), each
    with its nodes, its store and the fold's reason; ``next_after_round`` pages on (null at
    the end)."""

    job: str
    rounds: list[dict[str, Any]]
    next_after_round: int | None


class RendezvousStoryBody(Struct, kw_only=True):
    """``GET /rendezvous/{job}/story``: every join, round, leave, refusal and the closing, with
    offset, time and the fold's reason."""

    job: str
    until: int
    status: RendezvousBody
    summary: str
    entries: list[StoryEntry]
    keepalives: int
