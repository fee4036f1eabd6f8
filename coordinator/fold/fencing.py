"""Fencing and validation: which inputs the fold refuses, with the wire error code and a message
that names the ranks, incarnations, versions and deadlines involved.

``refusal`` is the one function behind both ``Coordinator.check`` (the host's pre-check, so a
refused input is never logged) and ``Coordinator.step`` (a record that fails it changes nothing),
so the two can never disagree. ``repeat_of`` is its other half for the two inputs that have a
name of their own (a group's, an idempotency key): the earlier input an identical one repeats, so
the host answers with it and appends nothing. Both decide sameness by the same two rules
(``same_config``, ``same_body``): the API only maps their answers to HTTP.

The rules it applies are files of their own, each given what it reads and returning its
refusal: ``fencing_ranks.py`` (a rank's inputs: range, incarnation, busy, OFFLINE, the version
an ACK may name), ``fencing_groups.py`` (a group's creation), ``fencing_proposals.py`` (an
idempotency key, a reconfigure's caller) and ``fencing_fast.py`` (a current rank's heartbeat
or ACK, accepted at once).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ...eventlog.record import KINDS, Record
from ...wire.codes import GROUP_ENDED, INVALID_EVENT, UNKNOWN_GROUP
from ...wire.inputs import RECONFIGURE, Input, decode, problem
from .config import ConfigError
from .effects import Proposal, Refused
from .facets import Facet, FoldContext
from .fencing_fast import beats_not_current, current_ack, current_beat
from .fencing_groups import group_created_refusal, parse_group_created, same_config
from .fencing_proposals import keyed, proposal_refusal, same_body
from .fencing_ranks import (
    Refusal,
    ack_refusal,
    current_incarnation,
    ended_text,
    join_refusal,
    online_rank_refusal,
    rank_in_group,
)
from .reconfigure import repeated_call
from .state import GroupState

#: The kinds ``repeat_of`` may find an earlier input for.
REPEATABLE = frozenset({"group_created", "group_ended", "proposal"})

_RANK_KINDS = frozenset({"join", "heartbeat", "links", "ack", "exit", "death_reported"})


def refusal(
    groups: Mapping[str, GroupState],
    proposals: Mapping[int, Proposal],
    now: int,
    kind: str,
    group: str | None,
    rank: int | None,
    payload: Any,
) -> Refusal | None:
    """Why this input must not be applied at time ``now``, or None.

    Checked in order: a known kind with an object payload; a group (unknown: ``unknown_group``);
    the payload's shape (``invalid_event``); for rank inputs, the rank in range, the group not
    failed, then the incarnation (``stale_incarnation``, ``rank_busy``, ``rank_offline``) and,
    for ACKs, the version in flight (``stale_version``); for proposals, the idempotency key.

    Nearly every input is a current rank's heartbeat, and a view change brings an ACK from
    every participant; :func:`current_beat` and :func:`current_ack` accept one of those at
    once, and only when every check below would (``tests/fold/test_fencing.py`` holds them
    to that), so everything else, refused or not, is decided and worded by the checks below.
    """
    if kind == "heartbeat":
        if current_beat(groups, group, rank, payload):
            return None
    elif kind == "ack" and current_ack(groups, group, rank, payload):
        return None
    return checked_refusal(groups, proposals, now, kind, group, rank, payload)


def checked_refusal(
    groups: Mapping[str, GroupState],
    proposals: Mapping[int, Proposal],
    now: int,
    kind: str,
    group: str | None,
    rank: int | None,
    payload: Any,
) -> Refusal | None:
    """:func:`refusal` by its checks alone, in the order it documents."""
    return checked_input(groups, proposals, now, kind, group, rank, payload)[0]


def checked_input(
    groups: Mapping[str, GroupState],
    proposals: Mapping[int, Proposal],
    now: int,
    kind: str,
    group: str | None,
    rank: int | None,
    payload: Any,
) -> tuple[Refusal | None, Input | None]:
    """:func:`checked_refusal`'s verdict and the input it decoded on the way (None when it
    refused before, or needed no decoding), so a step decodes each input once."""
    if kind not in KINDS:
        return (INVALID_EVENT, f"unknown kind {kind!r}; expected one of {sorted(KINDS)}"), None
    if not isinstance(payload, dict):
        return (INVALID_EVENT, f"payload must be an object, got {type(payload).__name__}"), None
    if kind == "tick":
        return None, None
    if group is None:
        return (INVALID_EVENT, f"a {kind} record must name a group"), None
    if kind == "group_created":
        return (group_created_refusal(groups, group, rank, payload)), None
    g = groups.get(group)
    if g is None:
        return (UNKNOWN_GROUP, f"no group named {group!r}"), None
    err = problem(kind, payload, g.config.world_size)
    if err is not None:
        return (INVALID_EVENT, f"{kind}: {err}"), None
    inp: Any = decode(kind, payload)
    if kind == "group_ended":
        if rank is not None:
            return (INVALID_EVENT, f"group_ended must not name a rank, got rank={rank}"), inp
        return None, inp
    if kind == "proposal":
        if rank is not None:
            return (
                INVALID_EVENT,
                f"a proposal names its ranks in the payload, not rank={rank}",
            ), inp
        return (proposal_refusal(g, proposals, inp)), inp
    if kind not in _RANK_KINDS:
        return None, inp
    if kind == "heartbeat" and rank is None and inp.ranks is not None:
        # Beats that share a record: the host checked each one against the fold right before
        # appending it (coordinator.fold.heartbeats), so the record only names the ranks.
        return None, inp
    if isinstance(rank, bool) or not isinstance(rank, int):
        return (INVALID_EVENT, f"a {kind} record must name a rank, got {rank!r}"), inp
    if kind == "join":
        if (refused := rank_in_group(g, rank)) is not None:
            return refused, inp
        return (join_refusal(g, rank, g.ranks[rank], inp.incarnation, now)), inp
    if kind == "death_reported" and inp.incarnation is None:
        return (rank_in_group(g, rank)), inp
    if kind in ("exit", "death_reported"):
        return (rank_in_group(g, rank) or current_incarnation(g, rank, inp.incarnation)), inp
    refused = online_rank_refusal(g, kind, rank, inp.incarnation)
    if refused is None and kind == "ack":
        return (ack_refusal(g, rank, inp.version)), inp
    return refused, inp


#: The kinds that may still name a group whose run is over: ending it again (to delete it), and
#: ticks (which name no group).
_AFTER_THE_END = frozenset({"group_ended", "tick"})


def over_refusal(groups: Mapping[str, GroupState], kind: str, group: str | None) -> Refusal | None:
    """``group_ended`` for any input but ``group_ended`` that names a group whose run is over
    (finished, ended or deleted: ``ending.py``), whatever the input and whoever sends it: one
    code, checked before every other check of the fold and of its facets, so nothing that
    arrives after the end can change the run's record."""
    if group is None or kind in _AFTER_THE_END:
        return None
    g = groups.get(group)
    if g is None or g.ended is None:
        return None
    return GROUP_ENDED, ended_text(g)


def repeat_of(
    groups: Mapping[str, GroupState],
    proposals: Mapping[int, Proposal],
    kind: str,
    group: str | None,
    rank: int | None,
    payload: Any,
) -> int | None:
    """The offset of the earlier input this one repeats, so that nothing need be appended: for
    a ``group_created`` identical to the group's, the group's creation (not once the group was
    ended: that is refused); for a ``group_ended`` of an ended group that asks for nothing new
    (no delete, or already deleted), the ending; for a proposal whose
    idempotency key names one with the same body, that proposal (its id). None for anything
    else: a new input, a conflict or a malformed one, which ``refusal`` words."""
    if kind not in REPEATABLE or group is None or rank is not None or not isinstance(payload, dict):
        return None
    g = groups.get(group)
    if g is None:
        return None
    if kind == "group_created":
        try:
            config = parse_group_created(decode(kind, payload))  # type: ignore[arg-type]
        except ConfigError:
            return None
        return g.created_offset if same_config(g.config, config) and g.ended is None else None
    if problem(kind, payload, 0 if kind == "group_ended" else g.config.world_size) is not None:
        return None
    inp: Any = decode(kind, payload)
    if kind == "group_ended":
        if g.ended is None or (inp.delete and not g.deleted):
            return None
        return g.ended_offset
    if inp.op == RECONFIGURE:
        return repeated_call(g, proposals, inp)
    seen = keyed(g, proposals, inp)
    return seen.id if seen is not None and same_body(seen, inp) else None


class Fences:
    """The fold's checks as the host calls them before an append (``check``, ``repeat_of``,
    the heartbeat fast checks) and as a step makes them again (``admit``); a facet's kinds go
    to the facet.

    It reads the groups, the proposals, the fold's time (``fold.now``), the kinds its
    composition knows (``kinds``) and which facet owns a kind (``facet_of``; a facet's checks
    are given ``fold``); it changes nothing, and returns the refusal (code, message) or None."""

    def __init__(
        self,
        fold: FoldContext,
        groups: Mapping[str, GroupState],
        proposals: Mapping[int, Proposal],
        facet_of: Mapping[str, Facet],
        kinds: frozenset[str],
    ) -> None:
        self._fold = fold
        self._groups = groups
        self._proposals = proposals
        self._facet_of = facet_of
        self._kinds = kinds

    def check(
        self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> Refused | None:
        """Would ``step`` refuse this input now? The host runs this before appending, so a
        refused input never reaches the log. The Refused carries offset 0: nothing was logged."""
        refusal = self.refusal(kind, group, rank, payload)
        if refusal is None:
            return None
        code, message = refusal
        return Refused(group=group, rank=rank, kind=kind, code=code, message=message, offset=0)

    def current_beat(self, group: str | None, rank: int | None, payload: Any) -> bool:
        """Whether :meth:`check` accepts this heartbeat by its first test alone (a current
        rank's beat: ``coordinator.fold.fencing.current_beat``); False says nothing."""
        return current_beat(self._groups, group, rank, payload)

    def beats_not_current(
        self, group: str, ranks: Sequence[int], payloads: Sequence[Any]
    ) -> list[int]:
        """The positions of the beats of ``group`` that :meth:`current_beat` does not accept,
        for many at once (``coordinator.fold.fencing.beats_not_current``)."""
        return beats_not_current(self._groups, group, ranks, payloads)

    def fence_epoch(self, group: str | None) -> int:
        """A number that changes whenever an input for a rank of ``group`` that :meth:`check`
        accepted may be refused now: a rank joined (a new incarnation, or back from OFFLINE),
        went OFFLINE, or the group failed to form. Those are all a rank input's refusal reads
        besides the input itself (``coordinator.fold.fencing.refusal``). -1 for no such group.
        The host checks a heartbeat waiting for its shared record again only when this changed
        since its first check."""
        g = self._groups.get(group) if group is not None else None
        return -1 if g is None else g.fence_epoch

    def repeat_of(
        self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> int | None:
        """The offset of the earlier input that this one repeats (an identical
        ``group_created``: the group's creation; a proposal with a known idempotency key and the
        same body: that proposal's id), or None. The host answers such an input with the earlier
        one and appends nothing; a conflict under the same name is ``check``'s refusal."""
        facet = self._facet_of.get(kind)
        if facet is not None:
            return facet.repeat_of(self._fold, kind, group, rank, payload)
        return repeat_of(self._groups, self._proposals, kind, group, rank, payload)

    def admit(
        self, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> tuple[Refusal | None, Input | None]:
        """:meth:`refusal`, with the membership input its checks decoded (None: a facet's, or
        one a fast check accepted), so a step decodes each input once."""
        if (over := over_refusal(self._groups, kind, group)) is not None:
            return over, None
        facet = self._facet_of.get(kind)
        if facet is not None:
            return facet.refusal(self._fold, kind, group, rank, payload), None
        if kind not in self._kinds:
            known = sorted(self._kinds)
            return (INVALID_EVENT, f"unknown kind {kind!r}; expected one of {known}"), None
        if kind == "ack" and current_ack(self._groups, group, rank, payload):
            return None, None
        return checked_input(
            self._groups, self._proposals, self._fold.now, kind, group, rank, payload
        )

    def refusal(
        self, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> tuple[str, str] | None:
        if (over := over_refusal(self._groups, kind, group)) is not None:
            return over
        facet = self._facet_of.get(kind)
        if facet is not None:
            return facet.refusal(self._fold, kind, group, rank, payload)
        if kind not in (kinds := self._kinds):
            return INVALID_EVENT, f"unknown kind {kind!r}; expected one of {sorted(kinds)}"
        return refusal(self._groups, self._proposals, self._fold.now, kind, group, rank, payload)

    def refused(self, record: Record, refusal: tuple[str, str]) -> Refused:
        code, message = refusal
        return Refused(
            group=record.group,
            rank=record.rank,
            kind=record.kind,
            code=code,
            message=message,
            offset=record.offset,
        )
