"""The lighthouse facet's checks: which records it refuses and why. A pure function of the
record and what it reads of the facet (the rule's settings, the incarnations reported lost);
it decides nothing. The steps are ``fold.py``'s.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...coordinator.fold.facets import Refusal
from ...wire.codes import INVALID_EVENT, REPLICA_LOST
from .effects import Settings
from .inputs import CONFIGURED, HEARTBEAT, LOST, MAX_REASON_BYTES, REQUEST, decode
from .messages import MAX_ID_BYTES


def input_refusal(
    kind: str,
    group: str | None,
    rank: int | None,
    payload: Any,
    settings: Settings | None,
    lost: dict[str, tuple[int, int]],
) -> Refusal | None:
    """A lighthouse record names no group and no rank, and its payload is its kind's
    (each field typed and bounded as ``messages`` bounds the wire's). A request needs the
    rule's settings (``lighthouse_configured``) and may not come from an incarnation a
    launcher reported lost: its process is dead, and a new one has a new id."""
    if group is not None or rank is not None:
        return INVALID_EVENT, f"{kind} names no group and no rank"
    try:
        if kind == CONFIGURED:
            configured = decode(kind, payload)
            problem = configured.problem()
            return None if problem is None else (INVALID_EVENT, f"{kind}: {problem}")
        if kind == REQUEST:
            if settings is None:
                return INVALID_EVENT, (
                    f"{kind}: the lighthouse has no settings yet "
                    "(a lighthouse_configured record comes first)"
                )
            member = decode(kind, payload)
            return _lost_refusal(kind, member.replica_id, lost) or _id_refusal(
                kind, member.replica_id
            )
        if kind == HEARTBEAT:
            beat = decode(kind, payload)
            if not beat.replicas:
                return INVALID_EVENT, f"{kind} names no replica"
            for r in beat.replicas:
                if refused := _id_refusal(kind, r):
                    return refused
            return None
        if kind == LOST:
            report = decode(kind, payload)
            if len(report.reason.encode()) > MAX_REASON_BYTES:
                return INVALID_EVENT, f"{kind}: reason over {MAX_REASON_BYTES} bytes"
            return _id_refusal(kind, report.replica)
        withdrawn = decode(kind, payload)
        return _id_refusal(kind, withdrawn.replica_id)
    except (msgspec.ValidationError, TypeError) as exc:
        return INVALID_EVENT, f"{kind}: {exc}"


def _lost_refusal(kind: str, replica_id: str, lost: dict[str, tuple[int, int]]) -> Refusal | None:
    """A request from an incarnation a launcher reported lost (``Lighthouse.lost_at``)."""
    entry = lost.get(replica_id)
    if entry is None:
        return None
    offset = entry[0]
    return REPLICA_LOST, (
        f"{kind}: replica {replica_id!r} was reported lost at offset {offset}; a "
        "restarted replica group asks under a new id"
    )


def _id_refusal(kind: str, replica_id: str) -> Refusal | None:
    if not replica_id or len(replica_id.encode()) > MAX_ID_BYTES:
        return INVALID_EVENT, f"{kind}: a replica id is 1 to {MAX_ID_BYTES} bytes"
    return None
