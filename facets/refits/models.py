"""The refits facet's request and answer bodies (docs/protocol.md); its routes add them to
the OpenAPI document's components (``SCHEMA_TYPES`` in ``routes.py``)."""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct

from ...api.models import StoryEntry
from ...wire.protocol import request_body
from .inputs import RefitCreatedInput, RefitRestartInput, TransferInput

RefitRequest = request_body(
    RefitCreatedInput,
    "RefitRequest",
    doc="""``POST /refits``: a weight refit from ``publisher`` (M slots) to ``subscriber`` (N slots)
    (docs/refit.md). Fields left out take ``facets.refits.inputs.SPEC_DEFAULTS``.""",
    forbid_unknown_fields=True,
)


TransferRequest = request_body(
    TransferInput,
    "TransferRequest",
    leave_out=("refit", "incarnation", "epoch"),  # the path names the refit; no agent's
    doc="``POST /refits/{refit}/transfers``: start transfer ``key`` (again, after a failure).",
    forbid_unknown_fields=True,
)
RefitRestartRequest = request_body(
    RefitRestartInput,
    "RefitRestartRequest",
    leave_out=("refit",),
    doc="``POST /refits/{refit}/restart``: a new epoch; ``reason`` goes into its cause.",
    forbid_unknown_fields=True,
)


class RefitMemberBody(Struct, kw_only=True):
    role: Literal["publisher", "subscriber"]
    slot: int
    group: str
    rank: int
    refit_rank: int


class RefitJoinedBody(Struct, kw_only=True):
    role: Literal["publisher", "subscriber"]
    slot: int
    group: str
    rank: int
    digest: str


class TransferBody(Struct, kw_only=True):
    id: int
    key: str
    attempt: int
    epoch: int
    status: Literal["running", "completed", "failed"]
    detail: str
    deadline: int | None
    offset: int
    done: list[str]


class RefitBody(Struct, kw_only=True):
    """``GET /refits/{refit}``: the definition, the current epoch and the transfers (never the
    bootstrap: only admitted members receive it)."""

    refit: str
    spec: dict[str, Any]
    created_offset: int
    epoch: int
    status: Literal["waiting", "admitted", "timed_out"]
    cause: str
    deadline_ts: int | None
    digest: str | None
    joined: list[RefitJoinedBody]
    missing: list[str]
    members: list[RefitMemberBody]
    bootstrap_published: bool
    transfers: list[TransferBody]


class RefitSummary(Struct, kw_only=True):
    refit: str
    epoch: int
    status: str
    cause: str


class RefitList(Struct, kw_only=True):
    refits: list[RefitSummary]


class RefitStoryBody(Struct, kw_only=True):
    """``GET /refits/{refit}/story``: what happened to a refit (docs/refit.md, "Seen")."""

    refit: str
    until: int
    epoch: int
    status: Literal["waiting", "admitted", "timed_out"]
    members: list[dict[str, Any]]
    transfers: list[dict[str, Any]]
    summary: str
    entries: list[StoryEntry]
    omitted: dict[str, int]
