"""The agent wire protocol: events in, updates out, deaths reported (docs/protocol.md).

``POST /agents/events`` is the hot path (every heartbeat of every rank), so it decodes with
msgspec, authenticates per event without a database, and hands the whole batch to the host in
one call; the host appends it with whatever else is queued (group commit).

The two agent hot paths are written as functions from the request's parts to the answer's
JSON bytes (:func:`events_answer`, :func:`updates_answer`): the routes below serve them through
the framework, and ``api.fastpath`` serves the same functions without it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
from fastapi import APIRouter, Query, Request
from starlette.responses import Response

from ...coordinator.auth import Authenticator, AuthError, Principal
from ...coordinator.host.facets import facet_hosts
from ...coordinator.host.loop import Appended, Host, Outcome, Refusal
from ...coordinator.host.polls import UpdatesAnswer
from ...eventlog import NewRecord
from ...wire import ranks as rank_sets
from ...wire.codes import (
    FORBIDDEN,
    INVALID_EVENT,
    INVALID_QUERY,
    PROTOCOL_MISMATCH,
    RANK_OUT_OF_RANGE,
    UPGRADE_REQUIRED,
)
from ...wire.protocol import (
    FEATURES,
    PROTOCOL,
    QUERY,
    AgentEventBase,
    EventReader,
    event_payload,
    group_problem,
    legacy_problem,
    missing_features,
)
from ...wire.ranks import MAX_QUERY_RANKS, RankSetError
from ..codec import (
    check_depth,
    convert,
    decode_json,
    encode_json,
    json_response,
    raw_json_response,
    read_json,
)
from ..deps import host_of, principal_of, require_group
from ..errors import ApiError
from ..models import (
    DeathReport,
    LooseEventsRequest,
)
from ..openapi import answers, body

router = APIRouter(prefix="/agents", tags=["agents"])


@router.post(
    "/events",
    summary="A batch of agent events (join, heartbeat, links, ack, exit); one result per event",
    openapi_extra=body("AgentEventsRequest"),
    responses=answers({200: "AgentEventsAnswer"}, 401, 403, 413, 422),
)
async def post_events(request: Request) -> Response:
    principal = principal_of(request)
    body = await request.body()
    return raw_json_response(await events_answer(request.app.state, principal, body))


async def events_answer(state: Any, principal: Principal, body: bytes) -> bytes:
    """The answer to ``POST /agents/events`` with this body, as JSON bytes."""
    batch = EventsBatch.read(state, principal, body)
    host: Host = state.host
    return batch.answer(await host.submit_many(batch.records, normalized=True), host.log.term)


class EventsBatch:
    """A ``POST /agents/events`` body read and checked: the records to append and, for each
    event the host never sees (malformed, forbidden), its error in place. Reading raises the
    request's own errors (``ApiError``) before anything is submitted, so a caller may submit
    the records however it waits for them (``events_answer`` awaits; the connection-level
    path of ``api.server`` takes the host's future) and answers with :meth:`answer`."""

    __slots__ = ("records", "results")

    def __init__(self, records: list[NewRecord], results: list[dict[str, Any] | None]) -> None:
        self.records = records
        self.results = results

    @classmethod
    def read(cls, state: Any, principal: Principal, body: bytes) -> EventsBatch:
        auth: Authenticator = state.auth
        check_depth(body, state.limits.max_json_depth)
        reader: EventReader = state.host.facets.events  # the host's facets' events
        events = _decode_events(reader, body)
        results: list[dict[str, Any] | None] = []
        records: list[NewRecord] = []
        operator = principal.is_operator
        for i, event in enumerate(events):
            if isinstance(event, str):
                results.append({"error": INVALID_EVENT, "detail": f"events[{i}]: {event}"})
                continue
            # the operator speaks for every rank; an event's own token may speak otherwise
            denied = None if operator and event.token is None else _denied(auth, principal, event)
            if denied is not None:
                results.append({"error": FORBIDDEN, "detail": f"events[{i}]: {denied}"})
                continue
            records.append(
                NewRecord(
                    kind=reader.kinds[type(event)],
                    group=event.group,
                    rank=event.rank,
                    payload=event_payload(event),
                )
            )
            results.append(None)
        return cls(records, results)

    def answer(
        self, outcomes: Sequence[Outcome], term: int, *, batch_id: int | None = None
    ) -> bytes:
        """The answer's JSON once the host has decided every record (one outcome each); on
        the host channel (``api.channel``) it carries the batch's ``id`` first."""
        decided = iter(outcomes)
        # the beats of one shared record have one outcome, the same object: worded once
        worded: dict[int, dict[str, Any]] = {}
        answered = []
        for result in self.results:
            if result is None:
                outcome = next(decided)
                result = worded.get(id(outcome))
                if result is None:
                    result = worded[id(outcome)] = _result(outcome)
            answered.append(result)
        if batch_id is None:
            return encode_json({"term": term, "results": answered})
        return encode_json({"id": batch_id, "term": term, "results": answered})


def _decode_events(reader: EventReader, body: bytes) -> list[AgentEventBase | str]:
    """The batch's events, each validated on its own: a bad one becomes its error text (its
    own ``invalid_event`` result) instead of failing the batch. The common case, a batch that
    is entirely valid, takes one typed decode."""
    try:
        events: list[AgentEventBase | str] = list(reader.decode_events(body))
    except (msgspec.ValidationError, msgspec.DecodeError):
        pass
    else:
        for i, event in enumerate(events):  # the group's pattern (``wire.protocol.EventGroupName``)
            if (problem := group_problem(event.group)) is not None:  # type: ignore[union-attr]
                events[i] = problem
        return events
    loose = decode_json(body, LooseEventsRequest)
    out: list[AgentEventBase | str] = []
    for raw in loose.events:
        if (legacy := legacy_problem(raw)) is not None:
            out.append(legacy)
            continue
        try:
            event = convert(raw, reader.event_type_of(raw))
        except msgspec.ValidationError as exc:
            out.append(str(exc))
            continue
        out.append(problem if (problem := group_problem(event.group)) is not None else event)
    return out


def _denied(auth: Authenticator, principal: Principal, event: Any) -> str | None:
    """Why this principal may not send this event, or None. A per-event token, when present,
    authenticates the event instead of the request's header."""
    if event.token is not None and auth.enabled:
        try:
            principal = auth.principal_for(event.token)
        except AuthError as exc:
            return exc.detail
    if principal.speaks_for(event.group, event.rank):
        return None
    return f"{principal.describe()} may not speak for rank {event.rank} of group {event.group!r}"


def _result(outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, Appended):
        return {"offset": outcome.offset}
    if isinstance(outcome, Refusal):
        out: dict[str, Any] = {"error": outcome.code, "detail": outcome.detail}
        if outcome.offset is not None:
            out["offset"] = outcome.offset
        return out
    return {"offset": outcome.id}


@router.get(
    "/updates",
    summary="Long-poll for the updates that concern one rank, or several ranks of one host",
    responses=answers({200: "UpdatesAnswerBody"}, 400, 401, 403, 404, 422),
)
async def get_updates(
    request: Request,
    group: str = Query(..., max_length=QUERY.group_chars),
    rank: int | None = Query(None, ge=0, le=QUERY.max_rank, description="one rank (or use ranks)"),
    ranks: str | None = Query(
        None,
        max_length=QUERY.ranks_chars,
        pattern=r"^[0-9,-]+$",
        description=f"several ranks of this group, as 0-7,12 (at most {MAX_QUERY_RANKS}): "
        "one poll per host",
    ),
    after: int = Query(
        0, ge=0, le=QUERY.max_offset, description="the last offset processed (exclusive)"
    ),
    timeout: float = Query(
        QUERY.poll_timeout_s, ge=0.0, le=QUERY.max_poll_s, description="seconds to wait"
    ),
    protocol: int | None = Query(
        None, description=f"the wire protocol the agent speaks; must be {PROTOCOL}"
    ),
    features: str | None = Query(
        None,
        max_length=200,
        description="the named revisions of the protocol the agent understands, "
        f"comma-separated ({','.join(FEATURES)})",
    ),
    view: int | None = Query(
        None, ge=0, description="the view version the agent holds (a resync then omits it)"
    ),
) -> Response:
    principal = principal_of(request)
    return raw_json_response(
        await updates_answer(
            request.app.state,
            principal,
            UpdatesQuery(group, poll_ranks(rank, ranks), after, timeout, protocol, view, features),
        )
    )


@router.get(
    "/channel",
    summary="The host channel: a WebSocket carrying a host's event batches and its ranks' "
    "updates (docs/protocol.md); without the upgrade it is answered 426",
    responses={
        101: {"description": "Switching Protocols: the channel is open"},
        **answers({}, 400, 401, 403, 404, 422, 426),
    },
)
async def get_channel(
    group: str | None = Query(
        None, max_length=QUERY.group_chars, description="the group of the ranks it carries"
    ),
    rank: int | None = Query(None, ge=0, le=QUERY.max_rank, description="one rank (or ranks)"),
    ranks: str | None = Query(
        None,
        max_length=QUERY.ranks_chars,
        pattern=r"^[0-9,-]+$",
        description="the ranks whose updates it carries, as 0-7,12; without group and ranks "
        "it carries events only",
    ),
    after: int = Query(
        0, ge=0, le=QUERY.max_offset, description="the last offset processed (exclusive)"
    ),
    protocol: int | None = Query(None, description=f"must be {PROTOCOL}"),
    view: int | None = Query(None, ge=0, description="the view version the host holds"),
) -> Response:
    raise ApiError(
        UPGRADE_REQUIRED,
        "GET /agents/channel opens a WebSocket: send Connection: Upgrade, Upgrade: websocket, "
        "Sec-WebSocket-Version: 13 and a Sec-WebSocket-Key (docs/protocol.md)",
    )


class UpdatesQuery(NamedTuple):
    group: str
    ranks: tuple[int, ...]
    after: int
    timeout: float
    protocol: int | None
    view: int | None
    features: str | None = None


def poll_ranks(rank: int | None, ranks: str | None) -> tuple[int, ...]:
    """The ranks a long poll names: ``rank=R`` or ``ranks=0-7,12``, not both."""
    if (rank is None) == (ranks is None):
        raise ApiError(INVALID_QUERY, "name the ranks with exactly one of rank= or ranks=")
    if rank is not None:
        return (rank,)
    try:
        return rank_sets.parse_query(ranks or "")
    except RankSetError as exc:
        raise ApiError(INVALID_QUERY, str(exc)) from None


async def updates_answer(state: Any, principal: Principal, query: UpdatesQuery) -> bytes:
    """The long poll itself, for the route above and for the fast path (``api.fastpath``),
    which calls it with a query it has parsed to the same bounds; the answer as JSON bytes."""
    group, ranks = query.group, query.ranks
    denied = [r for r in ranks if not principal.speaks_for(group, r)]
    if denied:
        raise ApiError(
            FORBIDDEN,
            f"{principal.describe()} may not read the updates of ranks {denied[:8]} of {group!r}",
        )
    if query.protocol != PROTOCOL:
        raise ApiError(
            PROTOCOL_MISMATCH,
            f"this coordinator speaks agent protocol {PROTOCOL}; the poll says "
            f"{'none (protocol 1)' if query.protocol is None else query.protocol}: "
            "upgrade the agent (docs/protocol.md)",
        )
    host: Host = state.host
    require_group(host, group)
    refuse_unnamed_revisions(host, group, query.features, "poll")
    config = host.reads.group_config(group)
    if ranks[-1] >= config.world_size:
        raise ApiError(
            RANK_OUT_OF_RANGE,
            f"rank {ranks[-1]} is not in 0..{config.world_size - 1} of group {group!r}",
        )
    answer = await host.updates(group, ranks, query.after, query.timeout, view=query.view)
    return encode_json(updates_body(host, answer))


def refuse_unnamed_revisions(host: Host, group: str, features: str | None, what: str) -> None:
    """A reader that does not name ``data_moves`` would ignore every data decision of the
    group's epochs and never see the work it is given: once a facet says the group's readers
    need the revisions (``FacetHost.readers_need``: the group has an epoch plan), it is refused
    by name (``protocol_mismatch``), as a protocol-1 agent is."""
    missing = missing_features(features)
    if not missing:
        return
    needs = next(
        (
            need
            for facet in facet_hosts(host.facets)
            if facet.readers_need is not None
            and (need := facet.readers_need(host.reads, group)) is not None
        ),
        None,
    )
    if needs is not None:
        raise ApiError(
            PROTOCOL_MISMATCH,
            f"group {group!r} {needs}, whose decisions protocol {PROTOCOL} sends as "
            f"{', '.join(missing)} updates; the {what} names features "
            f"{features or 'none'}: an agent built before them would ignore them silently. "
            "Upgrade the agent (docs/protocol.md)",
        )


def updates_body(host: Host, answer: UpdatesAnswer) -> dict[str, Any]:
    """What a long poll answers and what the host channel pushes: the same body, one way."""
    body: dict[str, Any] = {
        "term": host.log.term,
        "updates": answer.encoded,
        "next_after": answer.next_after,
        "resync": answer.resync,
        "store": host.store_address,
    }
    if answer.restored:
        body["restored"] = True
    return body


@router.post(
    "/deaths",
    summary="A supervisor or launcher reports that a rank died",
    openapi_extra=body("DeathReport"),
    responses=answers({200: "DeathAnswer"}, 401, 403, 404, 409, 413, 422),
)
async def report_death(request: Request) -> Response:
    principal = principal_of(request)
    req = await read_json(request, DeathReport)
    if not principal.speaks_for(req.group, req.rank):
        raise ApiError(
            FORBIDDEN,
            f"{principal.describe()} may not report the death of rank {req.rank} of {req.group!r}",
        )
    payload: dict[str, Any] = {
        "reporter": req.reporter
        or ("operator" if principal.is_operator else f"rank:{principal.rank}")
    }
    if req.incarnation is not None:
        payload["incarnation"] = req.incarnation
    host = host_of(request)
    outcome = await host.submit(
        NewRecord(kind="death_reported", group=req.group, rank=req.rank, payload=payload)
    )
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    assert isinstance(outcome, Appended)
    return json_response({"offset": outcome.offset, "term": host.log.term})
