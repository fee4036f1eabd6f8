"""The agent wire protocol, version 2: the one module both sides speak (docs/protocol.md).

Everything an agent sends (events) and the views it holds are declared here once: an event
is made from the input of the record it becomes (:func:`agent_event` over ``wire.inputs``,
which declares each kind's fields; an operator's request body likewise, :func:`request_body`);
everything it receives is declared once in ``wire.updates`` (one Struct per update, built here
for the view and its barrier), every code it may be answered with in ``wire.codes``. The
coordinator, the HTTP surface, the in-process agent and the simulated agent host all import
them, so a change to the protocol is a change to these files.

Costs that do not grow with the group, by construction:

- **Rank sets** (``wire.ranks``) are runs or a bitmap, so no set of a 65,536-rank group takes
  more than about 11 kB.
- **Link evidence** names only what is down. A ``links`` event carries ``down`` (the peers this
  rank now finds down), ``hint`` (the failed ranks of an operation) and ``self_ready``; every
  peer it does not name is up. ``reached: v`` says so explicitly: "I built view v and reached
  every member". A report therefore has the size of what is wrong, not of the group.
- **View updates are deltas.** ``view_committed`` says what changed since the previous version
  (``base``): ranks that entered or left each of the view's rank sets, the ranks whose state
  changed, grouped by state, and the cause. ``view_prepare`` says how the next active set
  differs from the current one and which of its members are absent. A rank folds them into
  the full view with :func:`apply_view_update`; the full view is there on request (a resync,
  ``GET /views/current``). A delta whose ``base`` is not the view the reader holds cannot be
  applied (:class:`StaleBase`): the reader resyncs.
- **Heartbeats share records**: the coordinator appends the beats that arrive together as one
  ``heartbeat`` record naming the ranks (see ``coordinator.fold.heartbeats``).

This module is pure: no I/O, clock, threads or randomness.
"""

from __future__ import annotations

import re
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Annotated, Any, ClassVar, Union

import msgspec
from msgspec import Meta, Struct

from . import inputs
from . import ranks as rank_sets
from .inputs import MAX_WORLD_SIZE, Incarnation, Rank
from .ranks import RankSetError
from .updates import RankSetDelta, ViewCommittedUpdate, ViewPrepareUpdate

#: The protocol version this module speaks. Agents send it as ``protocol`` on the updates long
#: poll; a poll without it (protocol 1) is refused with ``protocol_mismatch``.
PROTOCOL = 2
#: The named revisions of protocol 2 an agent understands, which it names as ``features`` on
#: the long poll and the host channel (comma-separated). A change within the version is added
#: by name: the coordinator sends what a revision adds only to readers that name it, and
#: refuses the others (``protocol_mismatch``, naming the revision) where they would silently
#: misread. ``data_moves``: a data decision reaches every rank as its moves, not as each
#: touched rank's whole part (docs/protocol.md, "Facet updates").
FEATURES = ("data_moves",)


def missing_features(named: str | None, wanted: tuple[str, ...] = FEATURES) -> list[str]:
    """The revisions of ``wanted`` that a reader's ``features`` field does not name."""
    have = set((named or "").split(","))
    return [f for f in wanted if f not in have]


# -- physical states ---------------------------------------------------------------------------

OFFLINE = "OFFLINE"
SYNCED = "SYNCED"
HEALTHY = "HEALTHY"
STATES = (OFFLINE, SYNCED, HEALTHY)

#: How a ``rank_state`` update's ``cause`` names a death reported by a supervisor.
CAUSE_DEATH_REPORTED = "death_reported"

# -- bounds ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QueryBounds:
    """The bounds of names and numbers in the HTTP API's queries, in one table: the routes
    declare them to the framework (so its ``422`` and the OpenAPI document say them), the long
    poll's fast path (``api.fastpath``) serves only a query within them, and the agent's relay
    clamps a worker's poll to them. Request bodies take theirs from the same fields
    (:data:`GroupName`, :data:`Rank`)."""

    #: characters of a group name
    group_chars: int = 64
    #: the highest rank
    max_rank: int = MAX_WORLD_SIZE - 1
    #: the highest log offset or view version a query may name (``after=``, ``until=``, ...)
    max_offset: int = 2**62
    #: characters of a long poll's ``ranks=`` (``wire.ranks.parse_query``)
    ranks_chars: int = rank_sets.MAX_QUERY_CHARS
    #: seconds a long poll waits when its ``timeout=`` names none
    poll_timeout_s: float = 25.0
    #: the longest ``timeout=`` a long poll may ask for, in seconds
    max_poll_s: float = 60.0
    #: the longest ``POST /proposals?wait=`` may ask for, in seconds
    max_wait_s: float = 60.0


QUERY = QueryBounds()

# -- events (POST /agents/events) --------------------------------------------------------------

#: What a group's name must match.
GROUP_PATTERN = rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{QUERY.group_chars - 1}}}$"
_GROUP_DESCRIPTION = f"1-{QUERY.group_chars} of A-Z a-z 0-9 . _ -, starting with a letter or digit"
GroupName = Annotated[str, Meta(pattern=GROUP_PATTERN, description=_GROUP_DESCRIPTION)]
#: :data:`GroupName` as an agent event carries it: the same schema, but decoding does not match
#: the pattern; :func:`group_problem` does, once per name, for the API
#: (``api.routes.agents``). Every heartbeat names its group, and matching the pattern for
#: each event was most of the time of decoding a batch of heartbeats.
EventGroupName = Annotated[
    str, Meta(extra_json_schema={"pattern": GROUP_PATTERN}, description=_GROUP_DESCRIPTION)
]
_GROUP_RE = re.compile(GROUP_PATTERN)
#: The names that matched (bounded: emptied when full).
_GOOD_GROUPS: set[str] = set()
_GOOD_GROUPS_MAX = 4096


def group_problem(name: str) -> str | None:
    """None if ``name`` is a well-formed group name, else what decoding a :data:`GroupName`
    field ``group`` says of it (the same text, so an event's error does not depend on which
    check found it)."""
    if name in _GOOD_GROUPS:
        return None
    if _GROUP_RE.search(name) is None:  # as msgspec matches a pattern
        return f"Expected `str` matching regex {GROUP_PATTERN!r} - at `$.group`"
    if len(_GOOD_GROUPS) >= _GOOD_GROUPS_MAX:
        _GOOD_GROUPS.clear()
    _GOOD_GROUPS.add(name)
    return None


#: The most events one ``POST /agents/events`` may carry.
MAX_EVENTS = 4096
#: No update is larger: a view change that changes k ranks sends O(k) bytes, and the extreme,
#: every rank set of a 65,536-rank view changing in a worst-case pattern, is about 120 kB
#: (each set a bitmap of at most 10,928 characters). ``tests/scale/test_limits.py`` checks it.
MAX_UPDATE_BYTES = 128 * 1024


class AgentEventBase(Struct, kw_only=True, tag_field="type", omit_defaults=True):
    """What every agent event carries: whose it is. Each event is a subclass tagged with its
    ``type``, the kind of the record it becomes; a facet beside membership declares its own
    (its plugin's ``events``, read by the :class:`EventReader` its composer builds)."""

    #: matched by :func:`group_problem`, not by the decoder (see :data:`EventGroupName`)
    group: EventGroupName
    rank: Rank
    incarnation: Incarnation
    #: Optional per-event agent token, so that one host can batch the events of all its ranks
    #: while each event is still authenticated for its own rank.
    token: Annotated[str, Meta(max_length=512)] | None = None
    #: Whether the event is a *report* (a facet's declares it): each says all the one before
    #: it said, so the agent sends the newest only (one not sent yet is replaced), sends none
    #: before its join is appended (it answers ``not_joined`` at once) and keeps none through
    #: a rejoin; its caller reports again. Not a field: no event carries it.
    report: ClassVar[bool] = False


def agent_event(
    input_cls: type[Struct], *, forbid_unknown_fields: bool = False, report: bool = False
) -> Any:
    """The agent event of a record kind, made from the kind's input (``wire.inputs``, or a
    facet's ``inputs.py``), which declares its fields once: the event is the envelope
    (:class:`AgentEventBase`, whose the event is; its ``incarnation`` is the input's) and the
    input's fields as the wire carries them (``inputs.wire_fields``), tagged with its ``kind``
    and named after it (``JoinInput`` -> ``JoinEvent``), so what an agent emits, what the API
    decodes and what the log stores are one declaration. A field left null or out is left out
    of the record (``omit_defaults``), as it was when the events were written out.
    ``forbid_unknown_fields``: a field the event does not declare is refused rather than
    ignored (one a newer agent may send is ignored otherwise). ``report``: the event is a
    report (:attr:`AgentEventBase.report`). The event names its input as ``input``."""
    return msgspec.defstruct(
        input_cls.__name__.removesuffix("Input") + "Event",
        inputs.wire_fields(input_cls, leave_out=AgentEventBase.__struct_fields__),
        bases=(AgentEventBase,),
        module=sys._getframe(1).f_globals["__name__"],
        namespace={"input": input_cls, "__doc__": input_cls.__doc__, "report": report},
        tag=input_cls.kind,  # type: ignore[attr-defined]
        kw_only=True,
        omit_defaults=True,
        forbid_unknown_fields=forbid_unknown_fields,
    )


def request_body(
    input_cls: type[Struct],
    name: str,
    *,
    envelope: type[Struct] = Struct,
    leave_out: tuple[str, ...] = (),
    doc: str | None = None,
    forbid_unknown_fields: bool = False,
) -> Any:
    """An HTTP request body made from the input of the record it becomes, as
    :func:`agent_event` makes an event: ``envelope``'s fields (what the record names beside its
    payload: the group, the rank), then the input's as the wire carries them, but those of
    ``leave_out``: what the route sets itself (a name its path gives) or the record of an
    operator's input lacks (an agent's incarnation). ``name`` and ``doc`` are the body's in the
    OpenAPI document (``doc`` None: the input's docstring). The body names its input as
    ``input``, and what it leaves out as ``left_out``."""
    envelope_fields = getattr(envelope, "__struct_fields__", ())
    return msgspec.defstruct(
        name,
        inputs.wire_fields(input_cls, leave_out=(*envelope_fields, *leave_out)),
        bases=(envelope,),
        module=sys._getframe(1).f_globals["__name__"],
        namespace={"input": input_cls, "left_out": leave_out, "__doc__": doc or input_cls.__doc__},
        kw_only=True,
        forbid_unknown_fields=forbid_unknown_fields,
    )


JoinEvent = agent_event(inputs.JoinInput)
HeartbeatEvent = agent_event(inputs.HeartbeatInput)
LinksEvent = agent_event(inputs.LinksInput, forbid_unknown_fields=True)
AckEvent = agent_event(inputs.AckInput)
ExitEvent = agent_event(inputs.ExitInput)

AgentEvent = JoinEvent | HeartbeatEvent | LinksEvent | AckEvent | ExitEvent
#: The protocol's own events: membership's (a facet declares its own in its folder, its
#: ``protocol.py``: ``facets/epochs/``' ``progress``, ``facets/refits/``' four).
PROTOCOL_EVENTS: tuple[type[AgentEventBase], ...] = (
    JoinEvent,
    HeartbeatEvent,
    LinksEvent,
    AckEvent,
    ExitEvent,
)
#: The events of membership itself; the agent answers every other kind to its sender
#: (``agent.machine``: a facet's event, a refit's).
MEMBERSHIP_EVENTS = frozenset({"join", "heartbeat", "links", "ack", "exit"})
#: What says whose an event is; a record keeps the rest as its payload (:func:`event_payload`).
_RECORD_ENVELOPE = ("type", "group", "rank", "token")


def event_payload(event: AgentEventBase) -> dict[str, Any]:
    """The record payload of an event: its fields but the envelope (the ``incarnation`` stays).
    ``to_builtins`` of a valid Struct already equals what decoding the payload's JSON gives
    back, so a host may hand it to the fold as it is (``submit_many(normalized=True)``)."""
    if type(event) is HeartbeatEvent:  # nearly all of the traffic: its two fields directly
        if event.version is None:
            return {"incarnation": event.incarnation}
        return {"incarnation": event.incarnation, "version": event.version}
    payload = msgspec.to_builtins(event)
    for name in _RECORD_ENVELOPE:
        payload.pop(name, None)
    return payload


class AgentEventsRequest(Struct, kw_only=True):
    """``POST /agents/events``: a batch, so one host can carry all its local ranks."""

    events: Annotated[list[AgentEvent], Meta(max_length=MAX_EVENTS)]


class LooseEventsRequest(Struct, kw_only=True):
    """What the server decodes first: a list of objects, each then validated on its own, so
    that one bad event gets its own ``invalid_event`` result instead of failing the batch."""

    events: Annotated[list[dict[str, Any]], Meta(max_length=MAX_EVENTS)]


class EventReader:
    """What one reader takes: a set of agent event Structs, each by its ``type`` (the kind of
    the record it becomes), and the decoder of a batch of their union. A value: whoever
    composes the facets builds one (``coordinator.fold.registry.Facets``), so two hosts in one
    process may take different events; nothing here changes once built."""

    __slots__ = ("types", "kinds", "_batch")

    def __init__(self, classes: Iterable[type[AgentEventBase]]) -> None:
        types: dict[str, type[AgentEventBase]] = {}
        for cls in classes:
            tag = getattr(getattr(cls, "__struct_config__", None), "tag", None)
            if not (isinstance(cls, type) and issubclass(cls, AgentEventBase)) or not isinstance(
                tag, str
            ):
                raise ValueError(
                    f"{cls!r} is not an agent event (a tagged wire.protocol.AgentEventBase)"
                )
            known = types.get(tag)
            if known is not None and known is not cls:
                raise ValueError(
                    f"event type {tag!r} of {cls.__name__} is declared already: {known}"
                )
            types[tag] = cls
        #: the event Struct of each wire ``type`` this reader takes
        self.types: Mapping[str, type[AgentEventBase]] = MappingProxyType(types)
        #: each event type's wire ``type``, the kind of the record it becomes
        self.kinds: Mapping[type, str] = MappingProxyType({c: k for k, c in types.items()})
        union = Union[tuple(types.values())]  # noqa: UP007 - built from the declared ones
        batch = msgspec.defstruct(
            "AgentEventsRequest",
            [("events", Annotated[list[union], Meta(max_length=MAX_EVENTS)])],  # type: ignore[valid-type]
            kw_only=True,
        )
        self._batch = msgspec.json.Decoder(batch)

    def with_types(self, *classes: type[AgentEventBase]) -> EventReader:
        """This reader and ``classes`` besides (a facet's events)."""
        return EventReader((*self.types.values(), *classes))

    def decode_events(self, body: bytes) -> list[AgentEventBase]:
        """A ``POST /agents/events`` body whose every event is valid, typed;
        ``msgspec.ValidationError`` or ``DecodeError`` otherwise (then read it loosely:
        :class:`LooseEventsRequest` and :meth:`event_type_of`, one event at a time)."""
        return self._batch.decode(body).events

    def event_type_of(self, item: Mapping[str, Any]) -> type[AgentEventBase]:
        """The Struct of one event as decoded JSON, by its ``type``; a ``type`` this reader
        does not take is a ``msgspec.ValidationError`` that lists the known ones."""
        kind = item.get("type")
        cls = self.types.get(kind) if isinstance(kind, str) else None
        if cls is None:
            raise msgspec.ValidationError(
                f"Invalid value {kind!r} - at `$.type`; the event types are {sorted(self.types)}"
            )
        return cls


#: The protocol's own events (:data:`PROTOCOL_EVENTS`), as one reader.
PROTOCOL_READER = EventReader(PROTOCOL_EVENTS)
#: Each event type's wire ``type``, the kind of the record it becomes (the protocol's own).
EVENT_KINDS: Mapping[type, str] = PROTOCOL_READER.kinds
#: The event Struct of each wire ``type`` of the protocol.
EVENT_TYPES: Mapping[str, type[AgentEventBase]] = PROTOCOL_READER.types


def decode_events(body: bytes) -> list[AgentEventBase]:
    """:meth:`EventReader.decode_events` of the protocol's own events."""
    return PROTOCOL_READER.decode_events(body)


def event_type_of(item: Mapping[str, Any]) -> type[AgentEventBase]:
    """:meth:`EventReader.event_type_of` of the protocol's own events."""
    return PROTOCOL_READER.event_type_of(item)


def legacy_problem(event: Mapping[str, Any]) -> str | None:
    """Why an event is in the shape of an older protocol, or None: an old agent must get a
    clear error, never a silent misreading."""
    if event.get("type") == "links" and ("peers" in event or "failed_ranks_hint" in event):
        return (
            f"links with 'peers'/'failed_ranks_hint' is protocol 1; protocol {PROTOCOL} reports "
            "'down' and 'hint' as rank sets (docs/protocol.md): upgrade the agent"
        )
    return None


def links_event(
    down: Iterable[int],
    hint: Iterable[int],
    self_ready: bool,
    version: int | None,
    ops: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The fields of a ``links`` event (without the envelope). ``ops`` (issued, completed):
    view ``version`` failed here blaming nobody, after that many operations on it."""
    down, hint = sorted(set(down)), sorted(set(hint))
    fields: dict[str, Any] = {"self_ready": self_ready}
    if down:
        fields["down"] = rank_sets.encode(down)
    if hint:
        fields["hint"] = rank_sets.encode(hint)
    if version is not None:
        fields["version"] = version
        if ops is not None and version > 0 and not down and not hint:
            fields["failed"] = version
            fields["issued"], fields["completed"] = ops
        elif version > 0 and not down and not hint and self_ready:
            fields["reached"] = version
    return fields


def links_down(payload: Mapping[str, Any], world_size: int) -> frozenset[int]:
    """The down evidence of a ``links`` payload: its ``down`` and its ``hint``."""
    down = payload.get("down")
    hint = payload.get("hint")
    out: set[int] = set()
    if down:
        out.update(rank_sets.decode(down, world_size, name="down"))
    if hint:
        out.update(rank_sets.decode(hint, world_size, name="hint"))
    return frozenset(out)


# -- views -------------------------------------------------------------------------------------


class View(Struct, frozen=True, kw_only=True):
    """A committed group view. ``cause`` is ``{"kind", "proposals", "detail"}`` where kind is
    ``formation``, ``proposal``, ``exit`` (it removes ranks that exited cleanly, and only
    those), ``auto_deactivation``, ``view_retry``, ``view_failed`` or ``reconfigure`` (torch's reconfigure, which adds ``uuid`` and ``order``: the members in the
    order of their handles; ``active_ranks`` stays sorted)."""

    group: str
    version: int
    active_ranks: tuple[int, ...]
    rank_states: dict[int, str]
    healthy_set: tuple[int, ...]
    cause: dict[str, Any]
    acked_ranks: tuple[int, ...]
    dropped_ranks: tuple[int, ...]
    offset: int
    ts: int
    #: the rank that saves the group's checkpoint in this view (docs/fold.md, checkpoint rank)
    checkpoint_rank: int | None = None

    def is_active(self, rank: int) -> bool:
        return _contains(self.active_ranks, rank)


def _contains(ordered: tuple[int, ...], rank: int) -> bool:
    """``rank in ordered`` for a sorted tuple, in O(log n): a view of 65,536 ranks is asked
    this by every rank of it."""
    i = bisect_left(ordered, rank)
    return i < len(ordered) and ordered[i] == rank


class StaleBase(ValueError):
    """A delta made against another view than the one the reader holds: resync."""


def _set_delta(old: Iterable[int], new: Iterable[int]) -> RankSetDelta:
    old_s, new_s = set(old), set(new)
    add, remove = new_s - old_s, old_s - new_s
    return RankSetDelta(
        add=rank_sets.encode(add) if add else None,
        remove=rank_sets.encode(remove) if remove else None,
    )


def _apply_set(old: Iterable[int], delta: RankSetDelta, ws: int, name: str) -> tuple[int, ...]:
    out = set(old)
    if delta.remove is not None:
        out.difference_update(rank_sets.decode(delta.remove, ws, name=f"{name}.remove"))
    if delta.add is not None:
        out.update(rank_sets.decode(delta.add, ws, name=f"{name}.add"))
    return tuple(sorted(out))


def view_update(base: View | None, view: View) -> ViewCommittedUpdate:
    """The ``view_committed`` update for ``view``: what changed since ``base`` (None: since
    nothing, which makes it the full view)."""
    old_states: Mapping[int, str] = base.rank_states if base is not None else {}
    changed: dict[str, list[int]] = {}
    for rank, state in view.rank_states.items():
        if old_states.get(rank) != state:
            changed.setdefault(state, []).append(rank)
    return ViewCommittedUpdate(
        offset=view.offset,
        group=view.group,
        version=view.version,
        base=base.version if base is not None else 0,
        states={state: rank_sets.encode(rs) for state, rs in sorted(changed.items())},
        cause=view.cause,
        ts=view.ts,
        checkpoint_rank=view.checkpoint_rank,
        active_ranks=_set_delta(base.active_ranks if base else (), view.active_ranks),
        healthy_set=_set_delta(base.healthy_set if base else (), view.healthy_set),
        acked_ranks=_set_delta(base.acked_ranks if base else (), view.acked_ranks),
        dropped_ranks=_set_delta(base.dropped_ranks if base else (), view.dropped_ranks),
    )


#: The last folds: (base, update, result). Many ranks in one process (a simulated host, a
#: relay's workers) fold the same update onto the same base view; they get the same result,
#: so it is computed once and the view is shared, not copied per rank (a view of 16,384 ranks
#: is rebuilt in milliseconds, and 16,384 copies of it would be gigabytes). The cache holds
#: values only: the result for a given base and update is always the same (updates are frozen).
_FOLDED: list[tuple[Any, Any, Any]] = []
_FOLDED_KEEP = 16


def _memo(fold: Callable[[Any, Any, int], Any]) -> Callable[..., Any]:
    def folded(base: Any, update: Any, world_size: int) -> Any:
        for seen_base, seen_update, result in _FOLDED:
            if (
                seen_base is base
                and (seen_update is update or seen_update == update)
                and result[0] == world_size
            ):
                return result[1]
        value = fold(base, update, world_size)
        _FOLDED.append((base, update, (world_size, value)))
        if len(_FOLDED) > _FOLDED_KEEP:
            del _FOLDED[0]
        return value

    folded.__doc__ = fold.__doc__
    folded.__name__ = fold.__name__
    return folded


@_memo
def apply_view_update(base: View | None, update: ViewCommittedUpdate, world_size: int) -> View:
    """The view a ``view_committed`` update makes of ``base`` (raises :class:`StaleBase` when
    it was made against another version, :class:`RankSetError` when it is malformed).
    Memoized for the many ranks of one process that fold the same update onto one view."""
    return fold_view_update(base, update, world_size)


def fold_view_update(base: View | None, update: ViewCommittedUpdate, world_size: int) -> View:
    """:func:`apply_view_update` without the memo, for a fold done once (the coordinator's
    stored view rows): nothing of it is kept."""
    have = base.version if base is not None else 0
    if update.base != have:
        raise StaleBase(
            f"version {update.version} is a delta from version {update.base}, "
            f"but this rank holds version {have}"
        )
    states = dict(base.rank_states) if base is not None else {}
    for state, encoded in update.states.items():
        for rank in rank_sets.decode(encoded, world_size, name=f"states.{state}"):
            states[rank] = state
    return View(
        group=update.group,
        version=update.version,
        rank_states=dict(sorted(states.items())),
        cause=dict(update.cause),
        offset=update.offset,
        ts=update.ts,
        checkpoint_rank=_checkpoint_rank(update.checkpoint_rank, world_size),
        active_ranks=_apply_set(
            base.active_ranks if base else (), update.active_ranks, world_size, "active_ranks"
        ),
        healthy_set=_apply_set(
            base.healthy_set if base else (), update.healthy_set, world_size, "healthy_set"
        ),
        acked_ranks=_apply_set(
            base.acked_ranks if base else (), update.acked_ranks, world_size, "acked_ranks"
        ),
        dropped_ranks=_apply_set(
            base.dropped_ranks if base else (), update.dropped_ranks, world_size, "dropped_ranks"
        ),
    )


def _checkpoint_rank(value: int | None, world_size: int) -> int | None:
    if value is None:
        return None
    if not 0 <= value < world_size:
        raise RankSetError(f"checkpoint_rank {value!r} is not a rank of a group of {world_size}")
    return value


# -- the barrier's prepare ---------------------------------------------------------------------


def prepare_update(
    *,
    group: str,
    version: int,
    base: View | None,
    active_ranks: Iterable[int],
    participants: Iterable[int],
    ack_deadline_ts: int,
    offset: int,
) -> ViewPrepareUpdate:
    """The ``view_prepare`` update: the next active set as a delta from the current view
    (``base``), and ``absent``: the members of the old or new view that are not participants
    (they are OFFLINE and need not ACK)."""
    old = base.active_ranks if base is not None else ()
    active_ranks = tuple(active_ranks)
    members = set(old) | set(active_ranks)
    absent = members - set(participants)
    return ViewPrepareUpdate(
        offset=offset,
        group=group,
        version=version,
        base=base.version if base is not None else 0,
        active_ranks=_set_delta(old, active_ranks),
        absent=rank_sets.encode(absent),
        ack_deadline_ts=ack_deadline_ts,
    )


class Prepared(Struct, frozen=True, kw_only=True):
    """What a ``view_prepare`` means for the view a rank holds (both tuples sorted)."""

    version: int
    active_ranks: tuple[int, ...]
    participants: tuple[int, ...]

    def is_active(self, rank: int) -> bool:
        return _contains(self.active_ranks, rank)

    def is_participant(self, rank: int) -> bool:
        return _contains(self.participants, rank)


@_memo
def apply_prepare(base: View | None, update: ViewPrepareUpdate, world_size: int) -> Prepared:
    """The active ranks and participants a ``view_prepare`` names, given the current view."""
    have = base.version if base is not None else 0
    if update.base != have:
        raise StaleBase(
            f"prepare of version {update.version} is a delta from version "
            f"{update.base}, but this rank holds version {have}"
        )
    old = base.active_ranks if base is not None else ()
    active = _apply_set(old, update.active_ranks, world_size, "active_ranks")
    absent = rank_sets.decode_set(update.absent, world_size, name="absent")
    members = sorted(set(old) | set(active))
    return Prepared(
        version=update.version,
        active_ranks=active,
        participants=tuple(r for r in members if r not in absent),
    )


__all__ = [
    "PROTOCOL",
    "AgentEvent",
    "AgentEventBase",
    "RankSetError",
    "StaleBase",
    "View",
    "apply_prepare",
    "apply_view_update",
    "EventReader",
    "event_payload",
    "decode_events",
    "event_type_of",
    "fold_view_update",
    "links_down",
    "links_event",
    "prepare_update",
    "view_update",
]
