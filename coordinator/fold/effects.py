"""The fold's effects: the values a step produces, for the host to carry out.

The protocol's glossary is ``wire``: the events and views (``wire.protocol``), the codes and
proposal statuses (``wire.codes``). This module declares only what the fold derives from them.
Every effect is a small frozen value that carries ``offset``, the offset of the log record whose
step produced it, and a ``type`` that is its wire name (``msgspec.to_builtins`` includes it).
Effects are derived, never appended: replaying the log produces them again, byte for byte.

Rank states are the three physical states of the SPEC: ``OFFLINE`` (gone, dead, timed out or
exited), ``SYNCED`` (talking to the coordinator, data plane not verified), ``HEALTHY`` (SYNCED
and inside the Healthy Set).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...wire.codes import APPLIED, APPLIED_WITH_DROPPED_RANKS, PENDING, REJECTED, TERMINAL
from ...wire.protocol import HEALTHY, OFFLINE, SYNCED, View
from .config import GroupConfig

# The physical states, the committed view and the proposal statuses are the wire's, re-exported
# for the fold's readers; the codes are read from ``wire.codes`` itself.
__all__ = [
    "APPLIED",
    "APPLIED_WITH_DROPPED_RANKS",
    "HEALTHY",
    "OFFLINE",
    "PENDING",
    "REJECTED",
    "SYNCED",
    "TERMINAL",
    "View",
]


class Proposal(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A proposal to change ``active_ranks``; ``id`` is the offset of its record.

    A ``reconfigure`` (torch's ``ProcessGroup.reconfigure``, ``coordinator/fold/reconfigure.py``)
    names its members in ``ranks`` in the order of their handles, and adds ``uuid``, each
    member's ``incarnations`` (in the same order), the members that have ``callers`` so far
    (in the order they called) with each one's ``calls`` id (None where a call gave none), and
    its own ``timeout_s`` if its first call gave one. The other
    ops leave those fields out of every document (``omit_defaults``), so their rows read as
    they always did.
    """

    id: int
    group: str
    op: str
    ranks: tuple[int, ...]
    proposer: str | None
    idempotency_key: str | None
    status: str
    version: int | None
    reason: str
    dropped_ranks: tuple[int, ...]
    offset: int
    resolved_offset: int | None
    uuid: int | None = None
    incarnations: tuple[str, ...] = ()
    callers: tuple[int, ...] = ()
    calls: tuple[str | None, ...] = ()
    timeout_s: float | None = None


class Effect(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    """Base of every effect. ``type`` is the wire name."""

    @property
    def type(self) -> str:
        return self.__struct_config__.tag  # type: ignore[return-value]


class GroupCreated(Effect, frozen=True, kw_only=True, tag="group_created"):
    group: str
    config: GroupConfig
    offset: int


class GroupFailed(Effect, frozen=True, kw_only=True, tag="group_failed"):
    """Formation missed its deadline; ``missing_ranks`` were not HEALTHY in time."""

    group: str
    reason: str
    missing_ranks: tuple[int, ...]
    offset: int


class GroupEnded(Effect, frozen=True, kw_only=True, tag="group_ended"):
    """The operator ended the group's run (``reason``); ``deleted``: it is also gone from the
    listings. Its history stays in the log and its projections."""

    group: str
    reason: str
    deleted: bool
    offset: int


class ViewPrepare(Effect, frozen=True, kw_only=True, tag="view_prepare"):
    """Phase one of the barrier: participants must ACK ``(version, incarnation)`` by the deadline."""

    group: str
    version: int
    active_ranks: tuple[int, ...]
    participants: tuple[int, ...]
    ack_deadline_ts: int
    cause: dict[str, Any]
    offset: int


class ViewCommitted(Effect, frozen=True, kw_only=True, tag="view_committed"):
    """``view`` is the group's committed view now; ``base`` the one it replaced (None for the
    first), which the view's projection row may be stored as a delta from."""

    view: View
    offset: int
    base: View | None = None


class RankState(Effect, frozen=True, kw_only=True, tag="rank_state"):
    """A rank's physical state changed (or its incarnation did); ``reason`` says why, for a
    person. ``cause`` is a code for programs where one is needed (``death_reported``: a
    supervisor reported this incarnation dead, so its agent must not rejoin)."""

    group: str
    rank: int
    state: str
    incarnation: str | None
    rank_epoch: int
    reason: str
    offset: int
    cause: str | None = None


class ProposalAccepted(Effect, frozen=True, kw_only=True, tag="proposal_accepted"):
    """The proposal is logged and pending; a ProposalResolved follows (maybe in the same step)."""

    proposal: Proposal
    offset: int


class ProposalResolved(Effect, frozen=True, kw_only=True, tag="proposal_resolved"):
    """The proposal reached its terminal status; it never changes again."""

    proposal: Proposal
    offset: int


class ShutdownWithSave(Effect, frozen=True, kw_only=True, tag="shutdown_with_save"):
    """The group's one and only shutdown directive: save state and stop.

    ``reason`` is ``max_failure_exceeded``, ``single_survivor``, ``all_ranks_lost`` or
    ``unresolved_view_failure`` (``coordinator.fold.stalls``). ``checkpoint_rank`` is the rank
    that saves: the current view's, failing over to the lowest live active rank.
    """

    group: str
    reason: str
    detail: str
    offset: int
    checkpoint_rank: int | None = None


class Refused(Effect, frozen=True, kw_only=True, tag="refused"):
    """An input that was fenced or invalid; it changed nothing. ``code`` is the wire error code."""

    group: str | None
    rank: int | None
    kind: str
    code: str
    message: str
    offset: int
