"""Fencing and validation: which inputs the fold refuses, with the wire error code and a message
that names the ranks, incarnations, versions and deadlines involved.

``refusal`` is the one function behind both ``Coordinator.check`` (the host's pre-check, so a
refused input is never logged) and ``Coordinator.step`` (a record that fails it changes nothing),
so the two can never disagree. ``repeat_of`` is its other half for the two inputs that have a
name of their own (a group's, an idempotency key): the earlier input an identical one repeats, so
the host answers with it and appends nothing. Both decide sameness by the same two rules
(``_same_config``, ``_same_body``): the API only maps their answers to HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from ...eventlog.record import KINDS, Record
from ...wire.codes import (
    DUPLICATE_PROPOSAL,
    GROUP_CONFLICT,
    GROUP_ENDED,
    GROUP_FAILED,
    IDEMPOTENCY_CONFLICT,
    INVALID_EVENT,
    RANK_BUSY,
    RANK_OFFLINE,
    RANK_OUT_OF_RANGE,
    STALE_INCARNATION,
    STALE_VERSION,
    UNKNOWN_GROUP,
)
from ...wire.inputs import (
    MAX_ID_LEN,
    RECONFIGURE,
    GroupCreatedInput,
    Input,
    ProposalInput,
    decode,
    problem,
)
from .config import ConfigError, GroupConfig
from .effects import HEALTHY, OFFLINE, Proposal, Refused
from .facets import Facet, FoldContext
from .reasons import ranks_text
from .reconfigure import (
    caller_problem,
    repeated_call,
    uuid_refusal,
)
from .state import FAILED, GroupState, RankInfo

#: (code, message)
Refusal = tuple[str, str]

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
        return (_group_created(groups, group, rank, payload)), None
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
        return (_proposal(g, proposals, inp)), inp
    if kind not in _RANK_KINDS:
        return None, inp
    if kind == "heartbeat" and rank is None and inp.ranks is not None:
        # Beats that share a record: the host checked each one against the fold right before
        # appending it (coordinator.fold.heartbeats), so the record only names the ranks.
        return None, inp
    if isinstance(rank, bool) or not isinstance(rank, int):
        return (INVALID_EVENT, f"a {kind} record must name a rank, got {rank!r}"), inp
    if kind == "join":
        if (refused := _rank_in_group(g, rank)) is not None:
            return refused, inp
        return (_join(g, rank, g.ranks[rank], inp.incarnation, now)), inp
    if kind == "death_reported" and inp.incarnation is None:
        return (_rank_in_group(g, rank)), inp
    if kind in ("exit", "death_reported"):
        return (_rank_in_group(g, rank) or _current_incarnation(g, rank, inp.incarnation)), inp
    refused = online_rank_refusal(g, kind, rank, inp.incarnation)
    if refused is None and kind == "ack":
        return (_ack(g, rank, inp.version)), inp
    return refused, inp


def online_rank_refusal(g: GroupState, kind: str, rank: Any, incarnation: Any) -> Refusal | None:
    """Why an input of ``rank`` (a heartbeat, a links report, an ACK, a progress report, ...)
    is not from the rank's current, online incarnation of a group that has not failed, or
    None: a rank in range, the group not failed, the input's ``incarnation`` the rank's current
    one, the rank not OFFLINE. Facets (``coordinator.fold.facets``) fence their rank inputs
    by the same checks."""
    if isinstance(rank, bool) or not isinstance(rank, int):
        return INVALID_EVENT, f"a {kind} record must name a rank, got {rank!r}"
    refused = _rank_in_group(g, rank) or _current_incarnation(g, rank, incarnation)
    if refused is not None:
        return refused
    if g.ranks[rank].state == OFFLINE:
        return RANK_OFFLINE, (
            f"rank {rank} incarnation {incarnation} is OFFLINE; send join to come back"
        )
    return None


def _rank_in_group(g: GroupState, rank: int) -> Refusal | None:
    ws = g.config.world_size
    if not 0 <= rank < ws:
        return RANK_OUT_OF_RANGE, f"rank {rank} is not in 0..{ws - 1} for group {g.name!r}"
    if g.ended is not None:
        return GROUP_ENDED, ended_text(g)
    if g.formation == FAILED:
        return GROUP_FAILED, f"group {g.name!r} failed to form: {g.formation_error}"
    return None


def ended_text(g: GroupState) -> str:
    """Why nothing joins ``g`` any more, and what to do instead."""
    how = "finished" if g.finished else "was ended"
    why = "every rank exited cleanly" if g.finished else g.ended
    deleted = ", then deleted" if g.deleted else ""
    return (
        f"group {g.name!r} (run {g.created_offset}) {how} at offset {g.ended_offset} ({why}"
        f"{deleted}); its history stays in the log as it was and a group name is used once: "
        "run again under another group name"
    )


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


def _current_incarnation(g: GroupState, rank: int, inc: Any) -> Refusal | None:
    info = g.ranks[rank]
    if inc != info.incarnation:
        return STALE_INCARNATION, _stale_text(rank, info, inc)
    return None


def current_beat(
    groups: Mapping[str, GroupState], group: str | None, rank: int | None, payload: Any
) -> bool:
    """Whether this is the heartbeat of a rank's current, not OFFLINE, incarnation in a group
    that has not failed, with a well-formed payload: one that :func:`refusal` accepts. False
    says nothing (the full checks decide)."""
    if type(payload) is not dict or type(rank) is not int or group is None:
        return False
    g = groups.get(group)
    if g is None or not 0 <= rank < g.config.world_size or g.formation == FAILED:
        return False
    info = g.ranks[rank]
    incarnation = payload.get("incarnation")
    version = payload.get("version")
    return (
        incarnation is not None
        and incarnation == info.incarnation  # a joined incarnation: a valid one
        and info.state != OFFLINE
        and "ranks" not in payload
        and (version is None or (type(version) is int and version >= 0))
    )


def current_ack(
    groups: Mapping[str, GroupState], group: str | None, rank: int | None, payload: Any
) -> bool:
    """Whether this is the ACK of the version being prepared by a participant that the change
    still counts (not dropped), from its current, not OFFLINE, incarnation, with a well-formed
    payload: one that :func:`refusal` accepts. False says nothing (the full checks decide)."""
    if type(payload) is not dict or type(rank) is not int or group is None:
        return False
    g = groups.get(group)
    if g is None or not 0 <= rank < g.config.world_size or g.formation == FAILED:
        return False
    change = g.change
    if change is None:
        return False
    info = g.ranks[rank]
    incarnation = payload.get("incarnation")
    version = payload.get("version")
    return (
        type(incarnation) is str
        and 0 < len(incarnation) <= MAX_ID_LEN
        and incarnation == info.incarnation
        and info.state != OFFLINE
        and type(version) is int
        and version >= 1
        and version == change.version
        and rank in change.members
        and rank not in change.dropped
    )


def beats_not_current(
    groups: Mapping[str, GroupState], group: str, ranks: Sequence[int], payloads: Sequence[Any]
) -> list[int]:
    """The positions of the beats ``(ranks[i], payloads[i])`` of ``group`` that
    :func:`current_beat` does not accept: the others are current. One call for an agent host's
    beats (the group is looked up once): the same verdict as :func:`current_beat` for each."""
    g = groups.get(group)
    if g is None or g.formation == FAILED:
        return list(range(len(ranks)))
    world_size = g.config.world_size
    infos = g.ranks
    out: list[int] = []
    for i, rank in enumerate(ranks):
        payload = payloads[i]
        if type(payload) is not dict or type(rank) is not int or not 0 <= rank < world_size:
            out.append(i)
            continue
        info = infos[rank]
        incarnation = payload.get("incarnation")
        version = payload.get("version")
        if not (
            incarnation is not None
            and incarnation == info.incarnation
            and info.state != OFFLINE
            and "ranks" not in payload
            and (version is None or (type(version) is int and version >= 0))
        ):
            out.append(i)
    return out


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
        return g.created_offset if _same_config(g.config, config) and g.ended is None else None
    if problem(kind, payload, 0 if kind == "group_ended" else g.config.world_size) is not None:
        return None
    inp: Any = decode(kind, payload)
    if kind == "group_ended":
        if g.ended is None or (inp.delete and not g.deleted):
            return None
        return g.ended_offset
    if inp.op == RECONFIGURE:
        return repeated_call(g, proposals, inp)
    seen = _keyed(g, proposals, inp)
    return seen.id if seen is not None and _same_body(seen, inp) else None


def parse_group_created(created: GroupCreatedInput) -> GroupConfig:
    """The config of a ``group_created`` input ``{"world_size": N, "config": {...}}``."""
    config = {} if created.config is msgspec.UNSET else created.config
    if not isinstance(config, dict):
        raise ConfigError("config", f"must be an object, got {config!r}")
    world_size = created.world_size
    if world_size is msgspec.UNSET:
        raise ConfigError("world_size", "is required")
    if "world_size" in config and config["world_size"] != world_size:
        raise ConfigError(
            "world_size",
            f"payload says {world_size!r} but config says {config['world_size']!r}",
        )
    return GroupConfig.from_request({**config, "world_size": world_size})


def _group_created(
    groups: Mapping[str, GroupState], group: str, rank: int | None, payload: dict[str, Any]
) -> Refusal | None:
    """Creating an identical group again is accepted (and changes nothing); another
    configuration under the same name is a conflict."""
    try:
        config = parse_group_created(decode("group_created", payload))  # type: ignore[arg-type]
    except ConfigError as exc:
        return INVALID_EVENT, f"group_created: {exc}"
    if rank is not None:
        return INVALID_EVENT, f"group_created must not name a rank, got rank={rank}"
    existing = groups.get(group)
    if existing is not None and existing.ended is not None:
        return GROUP_ENDED, ended_text(existing)
    if existing is not None and not _same_config(existing.config, config):
        return GROUP_CONFLICT, (
            f"group {group!r} exists with another configuration "
            f"({_config_diff(existing.config, config)}); creating it again must repeat it exactly"
        )
    return None


def _same_config(existing: GroupConfig, config: GroupConfig) -> bool:
    """Creating a group again is the same creation when it repeats the configuration exactly."""
    return existing == config


def _config_diff(existing: GroupConfig, config: GroupConfig) -> str:
    """Each field that differs, as ``field: old (existing) vs new``."""
    theirs, ours = existing.to_dict(), config.to_dict()
    return ", ".join(
        f"{k}: {theirs.get(k)!r} (existing) vs {ours.get(k)!r}"
        for k in sorted(set(theirs) | set(ours))
        if theirs.get(k) != ours.get(k)
    )


def _join(g: GroupState, rank: int, info: RankInfo, inc: str, now: int) -> Refusal | None:
    """A new incarnation may replace a rank unless the current one is HEALTHY and still
    heartbeating: two live processes must never speak for one rank."""
    if inc == info.incarnation or info.state != HEALTHY:
        return None
    last = g.alive[rank]
    deadline = last + g.cfg.heartbeat_timeout_ns
    if now < deadline:
        return RANK_BUSY, (
            f"rank {rank} is HEALTHY as incarnation {info.incarnation} (rank_epoch "
            f"{info.rank_epoch}), last heartbeat at {last}; a new incarnation can join after "
            f"that one exits, is reported dead or misses its heartbeat deadline at {deadline}"
        )
    return None


def _ack(g: GroupState, rank: int, version: int) -> Refusal | None:
    """Only the version being prepared, only from a participant still awaited or done."""
    change = g.change
    if change is None:
        return STALE_VERSION, (
            f"ACK for version {version} from rank {rank}, but no view change is in flight "
            f"(current version {g.version})"
        )
    if version != change.version:
        return STALE_VERSION, (
            f"ACK for version {version} from rank {rank}, but version {change.version} "
            "is being prepared"
        )
    if rank not in change.members:
        return STALE_VERSION, (
            f"rank {rank} is not a participant of version {version} "
            f"(participants {ranks_text(change.participants)})"
        )
    if rank in change.dropped:
        return STALE_VERSION, f"rank {rank} was already dropped from version {version}"
    return None


def _proposal(
    g: GroupState, proposals: Mapping[int, Proposal], proposal: ProposalInput
) -> Refusal | None:
    """A known idempotency key: the same body is the same proposal, another body a conflict.

    A reconfigure is one member's call (``coordinator/fold/reconfigure.py``): the caller is a
    member, speaking as its current, online incarnation (fenced as every rank input), and its
    uuid is new or names a pending proposal with the same members."""
    if proposal.op == RECONFIGURE:
        return (
            caller_problem(proposal)
            or online_rank_refusal(g, "reconfigure", proposal.caller, proposal.caller_incarnation)
            or uuid_refusal(g, proposals, proposal)
        )
    seen = _keyed(g, proposals, proposal)
    if seen is None:
        return None
    key = proposal.idempotency_key
    if _same_body(seen, proposal):
        return DUPLICATE_PROPOSAL, (
            f"idempotency key {key!r} already names proposal {seen.id} (status {seen.status})"
        )
    return IDEMPOTENCY_CONFLICT, (
        f"idempotency key {key!r} already names proposal {seen.id} "
        f"({seen.op} {list(seen.ranks)}, proposer {seen.proposer!r}); this one is "
        f"{proposal.op} {list(proposal.ranks)}, proposer {proposal.proposer!r}"
    )


def _keyed(
    g: GroupState, proposals: Mapping[int, Proposal], proposal: ProposalInput
) -> Proposal | None:
    """The proposal of the group that the input's idempotency key already names, if any."""
    key = proposal.idempotency_key
    if key is None or key not in g.keys:
        return None
    return proposals[g.keys[key]]


def _same_body(seen: Proposal, proposal: ProposalInput) -> bool:
    """The same body is the same request: the same op, set of ranks and proposer."""
    return (seen.op, sorted(set(seen.ranks)), seen.proposer) == (
        proposal.op,
        sorted(set(proposal.ranks)),
        proposal.proposer,
    )


def _stale_text(rank: int, info: RankInfo, inc: Any) -> str:
    if info.incarnation is None:
        return f"rank {rank} has not joined; incarnation {inc} is unknown"
    return (
        f"rank {rank} is now incarnation {info.incarnation} (rank_epoch {info.rank_epoch}); "
        f"{inc} is stale"
    )


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
