"""Operator endpoints: groups and proposals (docs/protocol.md, "Operator endpoints")."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from fastapi import APIRouter, Path, Query, Request
from starlette.responses import Response

from ...coordinator.fold.config import ConfigError, GroupConfig
from ...coordinator.fold.projections import proposal_doc, to_doc, view_doc
from ...coordinator.host.loop import Appended, Host, Outcome, Refusal
from ...coordinator.host.reads import Reads
from ...coordinator.host.views import ViewReader
from ...eventlog import NewRecord
from ...wire.codes import (
    FORBIDDEN,
    INTERNAL,
    INVALID_CONFIG,
    INVALID_REQUEST,
    NO_VIEW,
    TOO_MANY_GROUPS,
    TOO_MANY_RANKS,
    UNKNOWN_PROPOSAL,
    UNSUPPORTED_MEDIA_TYPE,
    status_of,
)
from ...wire.protocol import QUERY
from ..codec import encode_json, json_response, raw_json_response, read_json
from ..deps import host_of, principal_of, require_group, require_operator
from ..errors import ApiError
from ..limits import MAX_RANKS_PAGE, Limits, is_json
from ..models import CreateGroupRequest, EndGroupRequest, ProposalRequest
from ..openapi import answers, body
from ..paging import read_page

router = APIRouter(tags=["operator"])


@router.post(
    "/groups",
    summary="Create a group (idempotent for an identical configuration)",
    openapi_extra=body("CreateGroupRequest"),
    responses=answers({201: "GroupBody", 200: "GroupBody"}, 401, 403, 409, 413, 422, 429),
)
async def create_group(request: Request) -> Response:
    require_operator(request, "creating a group")
    req = await read_json(request, CreateGroupRequest)
    fields = msgspec.to_builtins(req)
    try:
        config = GroupConfig.from_request(fields)
    except ConfigError as exc:
        raise ApiError(INVALID_CONFIG, str(exc)) from None
    host = host_of(request)
    limits: Limits = request.app.state.limits
    admitted: dict[object, tuple[str, int]] = request.app.state.admitted_groups
    me = object()
    try:
        outcome = await host.submit(
            NewRecord(
                kind="group_created",
                group=req.group,
                payload={"world_size": config.world_size, "config": config.to_dict()},
            ),
            precheck=_room(req.group, config, limits, admitted, me),
        )
    finally:
        admitted.pop(me, None)
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    return json_response(
        _group_body(host, req.group, None, limits.ranks_page),
        201 if isinstance(outcome, Appended) else 200,
    )


def _room(
    group: str,
    config: GroupConfig,
    limits: Limits,
    admitted: dict[object, tuple[str, int]],
    me: object,
):
    """A new group must fit the server's limits on groups and on ranks. Whether a group of that
    name is the same creation again or a conflict is the fold's to say (the host asks
    ``Coordinator.repeat_of`` and ``check`` after this), so an existing name passes here.

    The host prechecks a whole batch against one state of the fold, so the limits count the
    fold's groups and also the creations already admitted that the fold does not hold yet
    (``admitted``, which the route empties of its own entry when it has its answer): two
    creations in one batch cannot both take the last room."""

    def check(machine: Reads) -> Outcome | None:
        if machine.group_config(group) is not None:
            return None
        pending = {
            g: n for g, n in admitted.values() if g != group and machine.group_config(g) is None
        }
        refused = _room_for(machine, config.world_size, limits, pending)
        if refused is None:
            admitted[me] = (group, config.world_size)
        return refused

    return check


def _room_for(
    machine: Reads, world_size: int, limits: Limits, pending: dict[str, int]
) -> Refusal | None:
    groups = [g for g in machine.groups() if not machine.group_deleted(g)]
    held = len(groups) + len(pending)
    if held >= limits.max_groups:
        return Refusal(
            TOO_MANY_GROUPS,
            f"the server holds {held} groups (counting those being created), its limit "
            f"(--max-groups {limits.max_groups})",
        )
    ranks = sum(machine.group_config(g).world_size for g in groups) + sum(pending.values())
    if ranks + world_size > limits.max_ranks:
        return Refusal(
            TOO_MANY_RANKS,
            f"a group of {world_size} ranks would bring the server to {ranks + world_size} ranks; "
            f"its limit is {limits.max_ranks} (--max-ranks), {limits.max_ranks - ranks} are left",
        )
    return None


def _group_body(host: Host, group: str, after: int | None, limit: int) -> dict[str, Any]:
    """The group's document with one page of its ``ranks``: those after rank ``after`` (from
    rank 0 when None), at most ``limit``; ``next_ranks_after`` says where the next page starts
    (None on the last). The per-rank part is what grows with the group; the rest is whole."""
    status = host.reads.group_status(group)
    assert status is not None
    status = dict(status)  # the read model's answer is shared: page a copy
    start = 0 if after is None else after + 1
    ranks = status["ranks"]
    status["ranks"] = ranks[start : start + limit]
    more = start + limit < len(ranks)
    status["next_ranks_after"] = start + limit - 1 if more else None
    return to_doc(status)


@router.get(
    "/groups",
    summary="Every group: size, version, state counts, failures, shut down or ended",
    responses=answers({200: "GroupList"}),
)
async def list_groups(request: Request) -> Response:
    host = host_of(request)
    return json_response({"groups": host.reads.group_list()})


@router.get(
    "/groups/{group}",
    summary="A group: configuration, current view, one page of rank states, pending proposals",
    responses=answers({200: "GroupBody"}, 404, 422),
)
async def get_group(
    request: Request,
    group: Annotated[str, Path(max_length=QUERY.group_chars)],
    ranks_after: int | None = Query(
        None, ge=0, le=QUERY.max_rank, description="the last rank of the previous page (exclusive)"
    ),
    ranks_limit: int | None = Query(
        None,
        ge=1,
        le=MAX_RANKS_PAGE,
        description="ranks in the page (default: the server's --ranks-page)",
    ),
) -> Response:
    host = host_of(request)
    require_group(host, group)
    limit = ranks_limit or request.app.state.limits.ranks_page
    return json_response(_group_body(host, group, ranks_after, limit))


@router.post(
    "/groups/{group}/end",
    summary="End the group's run: its ranks are told to stop; its history stays",
    openapi_extra=body("EndGroupRequest"),
    responses=answers({200: "GroupBody", 201: "GroupBody"}, 401, 403, 404, 413, 415, 422),
)
async def end_group(
    request: Request, group: Annotated[str, Path(max_length=QUERY.group_chars)]
) -> Response:
    require_operator(request, "ending a group")
    _require_json_body(request, f"POST /groups/{group}/end")
    req = await read_json(request, EndGroupRequest)
    payload = {} if req.reason is None else {"reason": req.reason}
    return await _end(request, group, payload)


@router.delete(
    "/groups/{group}",
    summary="Delete a group: end it, and take it out of the listings and the server's limits",
    responses=answers({200: "GroupBody", 201: "GroupBody"}, 401, 403, 404),
)
async def delete_group(
    request: Request, group: Annotated[str, Path(max_length=QUERY.group_chars)]
) -> Response:
    require_operator(request, "deleting a group")
    return await _end(request, group, {"reason": "deleted by the operator", "delete": True})


def _require_json_body(request: Request, what: str) -> None:
    """A ``POST`` that changes state takes ``application/json`` only (docs/protocol.md), so a
    web page cannot send it without a CORS preflight."""
    declared = request.headers.get("content-type", "")
    if not is_json(declared.encode("latin-1")):
        raise ApiError(
            UNSUPPORTED_MEDIA_TYPE,
            f"{what} takes Content-Type: application/json; the request declared "
            f"{declared or 'none'!r}",
        )


async def _end(request: Request, group: str, payload: dict[str, Any]) -> Response:
    """Append ``group_ended`` (answered with the earlier ending when it asks nothing new:
    200), then the group's document (201 when this call ended or deleted it)."""
    host = host_of(request)
    require_group(host, group)
    outcome = await host.submit(NewRecord(kind="group_ended", group=group, payload=payload))
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    limits: Limits = request.app.state.limits
    return json_response(
        _group_body(host, group, None, limits.ranks_page),
        201 if isinstance(outcome, Appended) else 200,
    )


@router.post(
    "/proposals",
    summary="Propose to activate or deactivate ranks, or call a reconfigure; wait up to ?wait= "
    "seconds for the outcome",
    openapi_extra=body("ProposalRequest"),
    responses=answers({200: "ProposalBody", 202: "ProposalBody"}, 401, 403, 404, 409, 413, 422),
)
async def create_proposal(
    request: Request,
    wait: float = Query(
        0.0, ge=0.0, le=QUERY.max_wait_s, description="seconds to wait for a terminal status"
    ),
) -> Response:
    principal = principal_of(request)
    req = await read_json(request, ProposalRequest)
    if not principal.may_propose_in(req.group):
        raise ApiError(FORBIDDEN, f"{principal.describe()} may not propose in group {req.group!r}")
    proposer = (
        f"rank:{principal.rank}" if not principal.is_operator else (req.proposer or "operator")
    )
    payload: dict[str, Any] = {"op": req.op, "ranks": req.ranks, "proposer": proposer}
    if req.idempotency_key is not None:
        payload["idempotency_key"] = req.idempotency_key
    key = ("idempotency", req.group, req.idempotency_key) if req.idempotency_key else None
    if req.op == "reconfigure":
        payload.update(_reconfigure_call(req, principal))
        # The calls of one uuid never share an append: each is checked against the last.
        key = ("reconfigure", req.group, req.uuid)
    else:
        fields = ("incarnations", "uuid", "caller", "call", "timeout_s")
        extra = [n for n in fields if getattr(req, n) is not None]
        if extra:
            raise ApiError(INVALID_REQUEST, f"{', '.join(extra)} belong to a reconfigure")
    host = host_of(request)
    # A known idempotency key: the fold answers the same body with its proposal (Existing),
    # another body with idempotency_conflict.
    outcome = await host.submit(
        NewRecord(kind="proposal", group=req.group, payload=payload), key=key
    )
    if isinstance(outcome, Refusal):
        raise ApiError(outcome.code, outcome.detail)
    if isinstance(outcome, Appended) and req.op == "reconfigure":
        # a member's call joins the proposal of its uuid (docs/reconfigure.md)
        joined = host.reads.proposal_by_uuid(req.group, req.uuid)  # type: ignore[arg-type]
        proposal_id = outcome.offset if joined is None else joined.id
    else:
        proposal_id = outcome.offset if isinstance(outcome, Appended) else outcome.id
    proposal = await host.wait_proposal(proposal_id, wait)
    if proposal is None:  # the fold did not record it: a bug worth a clear answer
        raise ApiError(INTERNAL, f"proposal {proposal_id} was appended but is unknown to the fold")
    return json_response(proposal_doc(proposal), status_of(proposal.status))


def _reconfigure_call(req: ProposalRequest, principal: Any) -> dict[str, Any]:
    """A reconfigure's own fields: every one given, and an agent calls only for its own rank."""
    missing = [n for n in ("incarnations", "uuid", "caller") if getattr(req, n) is None]
    if missing:
        raise ApiError(INVALID_REQUEST, f"a reconfigure needs {', '.join(missing)}")
    if req.idempotency_key is not None:
        raise ApiError(
            INVALID_REQUEST, "a reconfigure takes no idempotency_key: its uuid is its key"
        )
    assert req.caller is not None
    if not principal.speaks_for(req.group, req.caller):
        raise ApiError(
            FORBIDDEN,
            f"{principal.describe()} may not call reconfigure for rank {req.caller} of group "
            f"{req.group!r}: a member calls for itself",
        )
    fields: dict[str, Any] = {
        "incarnations": req.incarnations,
        "uuid": req.uuid,
        "caller": req.caller,
    }
    if not principal.is_operator:
        fields["proposer"] = f"rank:{req.caller}"
    if req.call is not None:
        fields["call"] = req.call
    if req.timeout_s is not None:
        fields["timeout_s"] = req.timeout_s
    return fields


@router.get(
    "/proposals/{proposal_id}",
    summary="A proposal and its status",
    responses=answers({200: "ProposalBody"}, 404),
)
async def get_proposal(request: Request, proposal_id: int) -> Response:
    proposal = host_of(request).reads.proposal(proposal_id)
    if proposal is None:
        raise ApiError(UNKNOWN_PROPOSAL, f"no proposal with id {proposal_id}")
    return json_response(proposal_doc(proposal))


@router.get(
    "/views/current",
    summary="The latest committed view of a group",
    tags=["views"],
    responses=answers({200: "ViewBody"}, 404),
)
async def current_view(
    request: Request, group: str = Query(..., max_length=QUERY.group_chars)
) -> Response:
    host = host_of(request)
    require_group(host, group)
    view = host.reads.current_view(group)
    if view is None:
        raise ApiError(NO_VIEW, f"group {group!r} has not formed yet (no committed view)")
    return json_response(view_doc(view))


@router.get(
    "/views/history",
    summary="Committed views in version order, paginated",
    tags=["views"],
    responses=answers({200: "ViewHistory"}, 404),
)
async def view_history(
    request: Request,
    group: str = Query(..., max_length=QUERY.group_chars),
    after_version: int = Query(0, ge=0, le=QUERY.max_offset),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    host = host_of(request)
    require_group(host, group)

    views = ViewReader(host.log, group)
    page = await read_page(
        views.page,
        lambda view: view.version,
        lambda view: encode_json(view.doc),
        after=after_version,
        limit=limit,
        budget=request.app.state.limits.max_page_bytes,
    )
    return raw_json_response(
        b'{"group":%s,"views":[%s],"next_after_version":%s}'
        % (encode_json(group), b",".join(page.items), encode_json(page.last if page.more else None))
    )
