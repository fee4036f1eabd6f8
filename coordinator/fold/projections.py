"""What the fold's effects become outside the fold: projection rows and agent updates.

Both the execution host and ``replay`` turn effects into projection rows through this one
module, so "what the host stored" and "what a fold from scratch gives" are computed the same way
and can be compared byte for byte.

Projection kinds, keyed ``(kind, group, seq)`` and upserted:

==============  =========  ==========================================================
kind            seq        document
==============  =========  ==========================================================
``group``       0          the group's configuration and creation offset
``view``        version    a committed view (append-only: a version is written once)
``proposal``    id         a proposal, rewritten when it resolves (terminal is final)
``rank_state``  rank       the rank's latest physical state
``failure``     0          why formation failed (``group_failed``)
``shutdown``    offset     a ``shutdown_with_save`` directive
==============  =========  ==========================================================
"""

from __future__ import annotations

from typing import Any

import msgspec

from coordinator.fold.effects import (
    Effect,
    GroupCreated,
    GroupFailed,
    Proposal,
    ProposalAccepted,
    ProposalResolved,
    RankState,
    ShutdownWithSave,
    View,
    ViewCommitted,
)
from eventlog import ProjectionRow

PROJECTION_KINDS = ("group", "view", "proposal", "rank_state", "failure", "shutdown")

_encoder = msgspec.json.Encoder(order="sorted")
_decoder = msgspec.json.Decoder(dict)


def to_doc(value: Any) -> dict[str, Any]:
    """A value as the JSON object the store keeps: string keys, lists, sorted on encoding.

    Round-tripping through JSON here means the host's rows equal what a reader decodes later.
    """
    return _decoder.decode(_encoder.encode(msgspec.to_builtins(value, str_keys=True)))


def view_doc(view: View) -> dict[str, Any]:
    return to_doc(view)


def proposal_doc(proposal: Proposal) -> dict[str, Any]:
    return to_doc(proposal)


def rows_for(effect: Effect) -> list[ProjectionRow]:
    """The projection rows an effect writes (none for effects that only concern the moment)."""
    if isinstance(effect, ViewCommitted):
        view = effect.view
        return [ProjectionRow("view", view.group, view.version, view_doc(view))]
    if isinstance(effect, ProposalAccepted | ProposalResolved):
        p = effect.proposal
        return [ProjectionRow("proposal", p.group, p.id, proposal_doc(p))]
    if isinstance(effect, RankState):
        doc = to_doc(effect)
        del doc["cause"]  # a code for the agents' updates; the row keeps the reason
        return [ProjectionRow("rank_state", effect.group, effect.rank, doc)]
    if isinstance(effect, GroupCreated):
        return [ProjectionRow("group", effect.group, 0, to_doc(effect))]
    if isinstance(effect, GroupFailed):
        return [ProjectionRow("failure", effect.group, 0, to_doc(effect))]
    if isinstance(effect, ShutdownWithSave):
        return [ProjectionRow("shutdown", effect.group, effect.offset, to_doc(effect))]
    return []


# -- agent updates (docs/protocol.md, GET /agents/updates) ------------------------------------
# The view updates (deltas) are the wire protocol's: ``wire.protocol.view_update`` and
# ``prepare_update``. The two below are per rank or per group and small.


def rank_state_update(effect: RankState) -> dict[str, Any]:
    update = {
        "offset": effect.offset,
        "type": "rank_state",
        "group": effect.group,
        "rank": effect.rank,
        "state": effect.state,
        "incarnation": effect.incarnation,
        "rank_epoch": effect.rank_epoch,
        "reason": effect.reason,
    }
    if effect.cause is not None:
        update["cause"] = effect.cause
    return update


def shutdown_update(effect: ShutdownWithSave) -> dict[str, Any]:
    return {
        "offset": effect.offset,
        "type": "shutdown_with_save",
        "group": effect.group,
        "reason": effect.reason,
        "detail": effect.detail,
    }
