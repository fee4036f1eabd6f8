"""Every code the coordinator, its relay and its agents answer with, each declared once with the
HTTP status it has wherever it is answered as a whole, and what it means (docs/protocol.md).

Three families share the table:

- **refusals**: the fold or the host refused an input (an event, a proposal, a plan). Inside an
  events batch a refusal is one result ``{"error": code, "detail": ...}`` of a ``200`` answer;
  a request refused as a whole (a proposal, a plan, a query) answers with the code's status.
- **request codes**: the HTTP surface refused the request before anything looked at it (a body
  too large, a malformed query, a missing token).
- **host codes**: this coordinator cannot take writes now (``503``; a client tries another
  address), or the relay found no coordinator.
- **agent codes**: what the agent answers its own caller (a progress report or a refit call
  made before the join, or after the agent stopped).

Proposal statuses are declared here too, with the status of the answer that carries one. A code
is compared and sent as its plain string; :func:`status_of` gives its status, :func:`error_body`
the one error shape.

This module is pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

Family = Literal["refusal", "request", "host", "agent", "proposal"]


@dataclass(frozen=True, slots=True)
class Code:
    """One code: its wire name, the HTTP status it answers with, its family and meaning."""

    name: str
    status: int
    family: Family
    meaning: str


_CODES: dict[str, Code] = {}


def _declare(name: str, status: int, family: Family, meaning: str) -> str:
    assert name not in _CODES, f"{name} is declared twice"
    _CODES[name] = Code(name, status, family, meaning)
    return name


# -- refusals of the fold and the host -----------------------------------------------------------

UNKNOWN_GROUP = _declare("unknown_group", 404, "refusal", "no group has this name")
RANK_OUT_OF_RANGE = _declare(
    "rank_out_of_range", 404, "refusal", "the rank is not in 0..world_size-1 of its group"
)
STALE_INCARNATION = _declare(
    "stale_incarnation",
    409,
    "refusal",
    "the event comes from an incarnation that is no longer the rank's current one",
)
RANK_BUSY = _declare(
    "rank_busy",
    409,
    "refusal",
    "a join from a new incarnation while the current one is HEALTHY and heartbeating",
)
RANK_OFFLINE = _declare(
    "rank_offline",
    409,
    "refusal",
    "a heartbeat, links or ACK from a rank held OFFLINE (it timed out or was reported dead): join again with the same incarnation",
)
STALE_VERSION = _declare(
    "stale_version", 409, "refusal", "an ACK for a version other than the one being prepared"
)
INVALID_EVENT = _declare(
    "invalid_event",
    422,
    "refusal",
    "a field is missing or has the wrong type, a rank set is malformed, or the event is in protocol 1's shape (the detail names it)",
)
GROUP_CONFLICT = _declare(
    "group_conflict", 409, "refusal", "the group exists with another configuration"
)
GROUP_FAILED = _declare(
    "group_failed", 409, "refusal", "the group failed to form; it takes no more rank events"
)
GROUP_ENDED = _declare(
    "group_ended",
    409,
    "refusal",
    "the group's run is over: it finished (every rank exited cleanly), was ended (POST /groups/{group}/end) or deleted; it takes no more joins, heartbeats, reports or proposals and its name is not reused: run again under another group name",
)
IDEMPOTENCY_CONFLICT = _declare(
    "idempotency_conflict",
    409,
    "refusal",
    "the idempotency key was used before for another proposal",
)
DUPLICATE_PROPOSAL = _declare(
    "duplicate_proposal", 409, "refusal", "the same change is already pending"
)
RECONFIGURE_UUID_USED = _declare(
    "reconfigure_uuid_used",
    409,
    "refusal",
    "a reconfigure's uuid was used before in this group by a proposal that is over (pass a fresh uuid each time)",
)
FORBIDDEN = _declare(
    "forbidden",
    403,
    "refusal",
    "the token does not speak for this group or rank, or is not the operator's",
)
PROTOCOL_MISMATCH = _declare(
    "protocol_mismatch", 400, "refusal", "the agent speaks another protocol version"
)
UNKNOWN_PROPOSAL = _declare("unknown_proposal", 404, "refusal", "no proposal has this id")
NO_VIEW = _declare("no_view", 404, "refusal", "the group has no committed view yet")
TOO_MANY_GROUPS = _declare(
    "too_many_groups", 429, "refusal", "a new group would be over --max-groups"
)
TOO_MANY_RANKS = _declare("too_many_ranks", 429, "refusal", "a new group would be over --max-ranks")
INVALID_CONFIG = _declare(
    "invalid_config", 422, "refusal", "a group configuration field is out of its bounds"
)
COMPACTED = _declare(
    "compacted", 422, "refusal", "the story asks for records the log has compacted away"
)
#: Epoch plans (``facets.epochs.cursor``, docs/data.md).
UNKNOWN_EPOCH = _declare(
    "unknown_epoch",
    404,
    "refusal",
    "a plan or progress report names an epoch that is not the group's open one (or none)",
)
EPOCH_CONFLICT = _declare(
    "epoch_conflict", 409, "refusal", "the plan conflicts with the group's epochs"
)
STALE_ASSIGNMENT = _declare(
    "stale_assignment",
    409,
    "refusal",
    "progress against an assignment the fold has since shortened: report again against the part received",
)
GROUP_NOT_FORMED = _declare(
    "group_not_formed", 409, "refusal", "a plan for a group with no committed view yet"
)
#: Weight refits (``wire.refit``, docs/refit.md).
UNKNOWN_REFIT = _declare("unknown_refit", 404, "refusal", "no refit has this name")
REFIT_CONFLICT = _declare(
    "refit_conflict",
    409,
    "refusal",
    "a refit created again with another definition, or a second, different bootstrap",
)
NOT_REFIT_MEMBER = _declare(
    "not_refit_member",
    409,
    "refusal",
    "the rank's group is neither of the refit's, the rank is not active in its committed view, or not a member of the admitted epoch (or not refit rank 0, for a bootstrap)",
)
INVALID_SLOT = _declare(
    "invalid_slot",
    409,
    "refusal",
    "a slot outside the side's 0..slots-1, one held by another rank, or a second slot for the same rank",
)
DIGEST_MISMATCH = _declare(
    "digest_mismatch",
    409,
    "refusal",
    "the join's plan digest differs from the refit's (the detail names who holds which)",
)
STALE_REFIT_EPOCH = _declare(
    "stale_refit_epoch",
    409,
    "refusal",
    "the refit has moved past the event's epoch; the detail says why (a view, a member lost, a timeout, a restart)",
)
REFIT_NOT_READY = _declare(
    "refit_not_ready",
    409,
    "refusal",
    "the epoch is not admitted: the detail names the slots it waits for, or, timed out, the slots that never joined",
)
UNKNOWN_TRANSFER = _declare("unknown_transfer", 404, "refusal", "no transfer has this key")
STALE_ATTEMPT = _declare(
    "stale_attempt", 409, "refusal", "a transfer report for an attempt that is over"
)
TRANSFER_FINAL = _declare(
    "transfer_final",
    409,
    "refusal",
    "a transfer report after the transfer completed (its state is final)",
)
TRANSFER_BUSY = _declare("transfer_busy", 409, "refusal", "a second transfer while one runs")
REPLICA_LOST = _declare(
    "replica_lost",
    409,
    "refusal",
    "a lighthouse call from a replica group incarnation that a launcher reported dead",
)
QUORUM_TIMEOUT = _declare(
    "quorum_timeout", 504, "refusal", "no lighthouse quorum took the caller in before its deadline"
)
#: torchrun's rendezvous (``facets/rendezvous``, docs/torchrun.md).
UNKNOWN_RENDEZVOUS = _declare(
    "unknown_rendezvous", 404, "refusal", "no torchrun rendezvous has this id (--rdzv-id)"
)
RENDEZVOUS_CLOSED = _declare(
    "rendezvous_closed",
    409,
    "refusal",
    "the rendezvous was closed (a node's torchrun shut it down: the job ended); it takes no more nodes, so a new run takes a new --rdzv-id",
)
RENDEZVOUS_CONFLICT = _declare(
    "rendezvous_conflict",
    409,
    "refusal",
    "a node joins with other settings (--nnodes, timeouts) than the rendezvous's first node (the detail names each)",
)
NODE_GONE = _declare(
    "node_gone",
    409,
    "refusal",
    "the node is not part of the rendezvous (it left, went silent past its keep-alive timeout, or its join timed out: the detail says which); it may join again",
)
TOO_MANY_NODES = _declare(
    "too_many_nodes", 429, "refusal", "more nodes would wait for a round than the rendezvous holds"
)

# -- the request itself ----------------------------------------------------------------------------

BAD_REQUEST = _declare("bad_request", 400, "request", "a Content-Length that is not a number")
NESTING_TOO_DEEP = _declare(
    "nesting_too_deep", 400, "request", "the body nests deeper than --max-json-depth"
)
UNAUTHORIZED = _declare(
    "unauthorized",
    401,
    "request",
    "no Authorization: Bearer header, a malformed one, or a malformed token (with WWW-Authenticate: Bearer)",
)
NOT_FOUND = _declare("not_found", 404, "request", "no endpoint has this path")
METHOD_NOT_ALLOWED = _declare(
    "method_not_allowed", 405, "request", "a known path with another method (with Allow)"
)
NOT_ACCEPTABLE = _declare(
    "not_acceptable", 406, "request", "the answer cannot have the media type asked for"
)
REQUEST_TIMEOUT = _declare(
    "request_timeout",
    408,
    "request",
    "the request was not sent whole within --request-timeout-s; the connection is closed",
)
BODY_TOO_LARGE = _declare("body_too_large", 413, "request", "the body is over --max-body-bytes")
UNSUPPORTED_MEDIA_TYPE = _declare(
    "unsupported_media_type", 415, "request", "a POST body not declared application/json"
)
INVALID_REQUEST = _declare(
    "invalid_request", 422, "request", "a malformed body or field: the detail names it"
)
INVALID_QUERY = _declare(
    "invalid_query", 422, "request", "a query field that is malformed, unknown or given twice"
)
UPGRADE_REQUIRED = _declare("upgrade_required", 426, "request", "another WebSocket version than 13")
TOO_MANY_REQUESTS = _declare("too_many_requests", 429, "request", "over a server limit on requests")
HEADERS_TOO_LARGE = _declare(
    "headers_too_large",
    431,
    "request",
    "the request line and headers are over --max-header-bytes; the connection is closed",
)
INTERNAL = _declare("internal", 500, "request", "a bug: the server logged it")
HTTP_ERROR = _declare("http_error", 500, "request", "an HTTP error this table does not name")
BAD_ANSWER = _declare(
    "bad_answer", 502, "request", "the coordinator's answer did not have the shape it must have"
)
NOT_FOLDPLANE = _declare(
    "not_foldplane",
    502,
    "request",
    "the answer is not a foldplane coordinator's JSON (some other HTTP server at that address): check the address and port",
)

# -- this coordinator cannot serve now -------------------------------------------------------------

NOT_LEADER = _declare(
    "not_leader",
    503,
    "host",
    "this coordinator is a standby; the body's leader names the leader (null when none is known)",
)
CLOSED = _declare("closed", 503, "host", "the coordinator is shutting down")
LOG_UNAVAILABLE = _declare("log_unavailable", 503, "host", "the event log failed")
FOLD_FAILED = _declare("fold_failed", 503, "host", "the fold failed; the host stopped")
CARRY_OUT_FAILED = _declare(
    "carry_out_failed",
    503,
    "host",
    "carrying out the fold's effects (updates, rows, read model) failed; the host stopped",
)
TOO_MANY_CONNECTIONS = _declare(
    "too_many_connections", 503, "host", "--max-connections are open (with Retry-After: 1)"
)
COORDINATOR_UNAVAILABLE = _declare(
    "coordinator_unavailable",
    503,
    "host",
    "no coordinator answered the relay in time, or the relay's queue is full (the detail says which)",
)

# -- what an agent answers its own caller (never sent over HTTP; the status is what it would be) ----

NOT_JOINED = _declare(
    "not_joined", 409, "agent", "the rank has not joined yet; the agent sends it again after"
)
AGENT_STOPPED = _declare("agent_stopped", 503, "agent", "the agent stopped; its reason says why")

# -- proposal statuses (with the status of the answer that carries one) ----------------------------

PENDING = _declare("pending", 202, "proposal", "the proposal waits for its view change")
APPLIED = _declare("applied", 200, "proposal", "the view change committed")
APPLIED_WITH_DROPPED_RANKS = _declare(
    "applied_with_dropped_ranks",
    200,
    "proposal",
    "the view change committed without ranks that failed to ACK",
)
REJECTED = _declare("rejected", 200, "proposal", "the proposal was refused: its reason says why")
#: The statuses nothing overwrites.
TERMINAL = frozenset({APPLIED, APPLIED_WITH_DROPPED_RANKS, REJECTED})
#: The statuses of a proposal whose view committed.
APPLIED_STATUSES = frozenset({APPLIED, APPLIED_WITH_DROPPED_RANKS})

#: Event errors that end an agent: retrying cannot help. A whole batch refused with one of the
#: request codes here ends it the same way.
FATAL_ERRORS = frozenset(
    {
        FORBIDDEN,
        RANK_OUT_OF_RANGE,
        INVALID_EVENT,
        PROTOCOL_MISMATCH,
        UNAUTHORIZED,
        BODY_TOO_LARGE,
        INVALID_REQUEST,
    }
)
#: Join errors an agent retries after a short wait.
RETRIED_JOIN_ERRORS = frozenset({RANK_BUSY, UNKNOWN_GROUP})

#: Every code, by name.
CODES: Mapping[str, Code] = _CODES


def status_of(code: str, default: int | None = None) -> int:
    """The HTTP status of ``code``; ``default`` for a code this table does not declare (one a
    newer coordinator sends through an older relay), or ``KeyError`` when there is none."""
    found = _CODES.get(code)
    if found is not None:
        return found.status
    if default is None:
        raise KeyError(f"{code!r} is not a declared code (wire.codes)")
    return default


def error_body(code: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The one error shape: ``{"error": code, "detail": message, ...}``."""
    return {"error": code, "detail": detail, **extra}
