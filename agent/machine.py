"""The agent's state machine: sans-I/O, like h11, driven like etcd raft.

An agent speaks for one ``(group, rank, incarnation)``. This module decides *what* it says and
*when*; it never says it itself. The host feeds it inputs (``Start``, ``UpdatesReceived``,
``EventsAnswered``, ``Tick``, ``LinkEvidence``, ...) with the time passed in as ``now`` (seconds
on any monotonic clock), and carries out the actions that ``step`` returns (send these events,
long-poll after this offset, install this view in the data plane, stop). ``next_deadline()``
says when the host must ``Tick`` next. Two tables say the machine's shape: ``INPUTS``, every
input, the phases that take it and its handler (any other input, or one in another phase, is
:class:`InputRefused`, naming it); ``TRANSITIONS``, every phase change and what makes it. Nothing here imports a clock, a socket or a thread, so
every rule is tested by feeding chosen inputs and reading the actions back.

The rules, in one place:

- **Join first.** Nothing but ``join`` is sent until the coordinator has appended it; then
  heartbeats start and, once the data plane is ready, ``links`` with ``self_ready: true`` (the
  coordinator makes a rank HEALTHY only after that report). A join refused with ``rank_busy``
  (the old incarnation is still HEALTHY) or ``unknown_group`` (not created yet) is retried.
- **In-place rejoin and replacement are one path.** A replacement process is a new machine with
  a new incarnation; an in-place rejoin (``Rejoin``, or the coordinator reporting this
  incarnation OFFLINE after its join, say after a heartbeat timeout) re-enters the same join
  path, keeping the offset. A death *reported* by a supervisor is not contested: the agent
  stops rather than race the replacement for the rank.
- **Updates are processed once, in offset order.** ``after`` is the offset of the last update
  processed; every poll, including the first after a reconnect, resumes there. A resync
  answer says where the log stands and the machine resumes there; one that says the log was
  *restored* from an older copy (it is behind this rank) also drops what the newer log told
  it (view, offsets) and joins again, since the restored log may not know this incarnation. A batch is
  folded before acting, so catching up on a long history installs only the latest view.
  Each update is a Struct of ``wire.updates``, handled by its class (``_ON_UPDATE``).
- **The barrier.** A ``view_prepare`` is ACKed with ``(version, incarnation)`` when this rank is
  a participant, it has joined, and, if it is in the new ``active_ranks``, its data plane is
  ready (a view that names a rank whose data plane cannot build it would fail on every member).
  ``view_committed`` installs the view in the data plane.
- **A view before the join names another process.** A view committed before this
  incarnation first joined (the one a replacement reads while the process it replaces still
  holds the rank) does not take it in, though it lists the rank (``member_of``,
  ``InstallView.member``): the data plane follows it as a rank outside it, and only a later
  view (an activation) takes this process in.
- **The store moves with the coordinator.** Every answer of the updates names the rendezvous
  store. The first address connects the data plane; another one (the coordinator restarted, or
  another one leads) moves it there before anything else of that answer is acted on, and no
  view in which this rank is active is ACKed until the host reports the data plane ready on
  the new store (``DataPlaneReady``): its group would be built there.
- **Fencing is the coordinator's.** ``stale_incarnation`` on any event, or a ``rank_state``
  naming another incarnation after our join, means another process now speaks for this rank:
  the machine stops (``Stopped("fenced")``) and sends nothing more.
- **Heartbeats have a lane of their own.** The coordinator appends the beats that arrive
  together as one shared record, so a beat's answer may wait for that record (up to half a
  second); joins, links, ACKs and exits never wait behind it. One beat is in flight at a time;
  a beat that falls due meanwhile replaces the one waiting to be sent.
- **Link evidence names what is down.** A ``links`` report carries the peers found down and the
  failure hint (rank sets, ``wire.ranks``) and the view they were found on; every peer it
  does not name is up. A report equal to the last one this incarnation sent since its join is
  not sent again: it would change nothing, and after every view every rank would otherwise
  report it. Down evidence found again on a newer view is sent again (the coordinator counts
  it only against peers whose process joined before that view).
- **Views arrive as deltas.** ``view_committed`` and ``view_prepare`` say what changed since the
  version before (``wire.protocol``); the machine folds them into the full view. A delta that
  does not fit the view held (which only a coordinator restored from an older copy could cause)
  makes the machine drop its view and read the updates again from the start, where the first
  answer is a resync with the full view.
- **Events are the wire's Structs.** Each event the machine queues is its ``wire.protocol``
  Struct (``JoinEvent``, ``HeartbeatEvent``, ``LinksEvent``, ``AckEvent``, ``ExitEvent``,
  a facet's declared one) with this rank's envelope filled; its answer is
  handled by its class.
- **Retry without loss.** A batch that could not be delivered goes back to the front of the
  outbox and is resent after an exponential backoff.
- **A clean exit is not a death.** ``Close`` sends ``exit`` (after an in-flight join, if any)
  and stops when it is appended.
- **A facet's updates are its followers'.** Every update the machine does not follow itself
  (the epochs' and refits' Structs, any other facet's declared one) is handed on as a
  ``FacetUpdate`` in offset order, unless it names another rank; the agent gives it to whoever
  follows its Struct (``Agent.on_update``).
- **A report is sent newest only.** A facet's event that declares itself a report
  (``AgentEventBase.report``: the epochs' ``progress``) replaces one of its kind not yet
  sent, is answered ``not_joined`` at once before the join is appended, and is not kept
  through a rejoin: its sender reports again (the others wait behind the join).
- **A facet's events are its sender's.** An event of any kind but membership's own
  (``SendEvent``: a facet's worker part's, any other facet's declared one) goes in the events
  lane and its answer comes back as ``EventAnswered``, accepted or refused: a refused one never
  ends the agent (a stale incarnation does, as for every event).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import Struct

from ..wire.codes import (
    FATAL_ERRORS,
    GROUP_ENDED,
    INVALID_EVENT,
    NOT_JOINED,
    RANK_OFFLINE,
    RETRIED_JOIN_ERRORS,
    STALE_INCARNATION,
    STALE_VERSION,
)
from ..wire.protocol import (
    CAUSE_DEATH_REPORTED,
    EVENT_TYPES,
    HEALTHY,
    MEMBERSHIP_EVENTS,
    OFFLINE,
    SYNCED,
    AckEvent,
    AgentEventBase,
    ExitEvent,
    HeartbeatEvent,
    JoinEvent,
    LinksEvent,
    Prepared,
    StaleBase,
    View,
    apply_prepare,
    apply_view_update,
    links_event,
)
from ..wire.ranks import RankSetError
from ..wire.updates import (
    AgentUpdate,
    RankStateUpdate,
    ShutdownUpdate,
    Update,
    ViewCommittedUpdate,
    ViewPrepareUpdate,
    addressed_rank,
)

__all__ = ["HEALTHY", "OFFLINE", "SYNCED", "View"]

# ---------------------------------------------------------------------------------------------
# Values

#: The two lanes events travel in: heartbeats, and everything else.
EVENTS, BEATS = "events", "beats"


class StoreAddress(Struct, frozen=True):
    """Where the rendezvous store (a torch TCPStore hosted by the coordinator) listens."""

    host: str
    port: int
    #: new at every start of the store: the same address after a coordinator restart on a
    #: fixed port is another store (it lost its keys), and the data plane must move to it
    id: str = ""


@dataclass(frozen=True)
class AgentConfig:
    """Who the agent speaks for, and its timing (seconds)."""

    group: str
    rank: int
    incarnation: str
    #: the group's size: the bound every rank set received is checked against
    world_size: int = 65_536
    heartbeat_interval_s: float = 1.0
    join_retry_s: float = 0.5
    retry_initial_s: float = 0.05
    retry_max_s: float = 2.0


# ---------------------------------------------------------------------------------------------
# Inputs (what happened)


class Start(Struct, frozen=True):
    now: float


class Tick(Struct, frozen=True):
    now: float


class UpdatesReceived(Struct, frozen=True):
    """An answer of ``GET /agents/updates``: the updates, where to resume, the store."""

    now: float
    #: each decoded into its Struct (the client's ``UpdateReader``: the protocol's updates and
    #: those of the facets the agent was given with ``Agent.on_update``)
    updates: tuple[AgentUpdate, ...]
    next_after: int
    store: StoreAddress | None = None
    resync: bool = False
    #: the coordinator's log is behind this rank: it was restored from an older copy
    restored: bool = False


class PollFailed(Struct, frozen=True):
    now: float
    detail: str


class EventsAnswered(Struct, frozen=True):
    """The coordinator answered the batch in flight in ``lane``: one result per event."""

    now: float
    results: tuple[Mapping[str, Any], ...]
    lane: str = EVENTS


class EventsFailed(Struct, frozen=True):
    """The batch in flight in ``lane`` was not delivered (no coordinator reachable, or a
    refused request)."""

    now: float
    detail: str
    lane: str = EVENTS


class DataPlaneReady(Struct, frozen=True):
    now: float


class LinkEvidence(Struct, frozen=True):
    """The data plane's own view of its links after an op failed or a view was verified."""

    now: float
    version: int
    peers: Mapping[int, str]
    failed_ranks_hint: tuple[int, ...] = ()
    #: the view failed here blaming nobody, after (issued, completed) operations on it
    ops: tuple[int, int] | None = None


class Rejoin(Struct, frozen=True):
    """Re-enter the join path in place (same process, same incarnation, same offset)."""

    now: float


class Close(Struct, frozen=True):
    now: float


#: The events the machine sends and answers itself; every other kind is a facet's
#: (``SendEvent``, answered by ``EventAnswered``).
OWN_EVENTS = MEMBERSHIP_EVENTS


class SendEvent(Struct, frozen=True):
    """Send a facet's event (any kind but :data:`OWN_EVENTS`), with its fields but the
    envelope, which the machine adds. ``event_type``: its Struct (a facet's own); None for
    one the agent's worker side reads (``agent.facets.EVENTS``: a facet's declared one)."""

    now: float
    kind: str
    fields: Mapping[str, Any]
    event_type: type[AgentEventBase] | None = None


Input = (
    Start
    | Tick
    | UpdatesReceived
    | PollFailed
    | EventsAnswered
    | EventsFailed
    | DataPlaneReady
    | LinkEvidence
    | Rejoin
    | Close
    | SendEvent
)

# ---------------------------------------------------------------------------------------------
# Actions (what the host must do)


class SendEvents(Struct, frozen=True):
    """POST these wire events (``wire.protocol``'s Structs, the envelope filled) as one batch,
    then feed back EventsAnswered or EventsFailed of the same ``lane``. The two lanes are
    independent: one batch may be in flight in each."""

    events: tuple[AgentEventBase, ...]
    lane: str = EVENTS


class PollUpdates(Struct, frozen=True):
    """Long-poll ``/agents/updates`` after ``after``, once ``delay_s`` has passed; ``view`` is
    the version held (so a resync need not send it again)."""

    after: int
    delay_s: float = 0.0
    view: int | None = None


class ConnectDataPlane(Struct, frozen=True):
    """The store is known: build the data plane (once per process)."""

    store: StoreAddress


class MoveDataPlane(Struct, frozen=True):
    """The coordinator advertises another store: move the data plane there, then report
    ``DataPlaneReady``. Carried out before the actions that follow it."""

    store: StoreAddress


class InstallView(Struct, frozen=True):
    """A view committed: the data plane builds its group over ``view.active_ranks``.
    ``member``: this incarnation is one of them (``AgentMachine.member_of``); a view that
    lists the rank but was committed before this incarnation joined names the process it
    replaced, and this one must not enter its group."""

    view: View
    member: bool = False


class RankStateChanged(Struct, frozen=True):
    """This rank's own physical state, as the coordinator last reported it."""

    state: str
    reason: str


class ShutdownWithSave(Struct, frozen=True):
    """The group's shutdown directive; ``checkpoint_rank`` is the rank that saves."""

    reason: str
    detail: str
    checkpoint_rank: int | None = None


class FacetUpdate(Struct, frozen=True):
    """An update of a facet the machine does not follow itself (a Struct a worker follows with
    ``Agent.on_update``), for the group or for this rank: handed on, in offset
    order, to whoever follows it (``Agent.on_update``)."""

    update: Update


class _NotValid(ValueError):
    """A facet event's fields do not fit its Struct: answered ``invalid_event`` to its caller."""


class EventAnswered(Struct, frozen=True):
    """The coordinator's answer to a facet's event (``SendEvent``): ``error`` None when it was
    appended (or answered with the earlier record it repeats, ``offset``)."""

    kind: str
    fields: Mapping[str, Any]
    offset: int | None = None
    error: str | None = None
    detail: str = ""


class Stopped(Struct, frozen=True):
    """The agent is done: ``closed`` (a clean exit), ``fenced`` or ``failed``."""

    reason: str
    detail: str


Action = (
    SendEvents
    | PollUpdates
    | ConnectDataPlane
    | MoveDataPlane
    | InstallView
    | RankStateChanged
    | ShutdownWithSave
    | FacetUpdate
    | EventAnswered
    | Stopped
)

# ---------------------------------------------------------------------------------------------
# The machine

#: The phases of an agent's life (:data:`TRANSITIONS`).
_NEW, _JOINING, _JOINED, _CLOSING, _STOPPED = "new", "joining", "joined", "closing", "stopped"

#: Every phase change the machine makes, and what makes it: the agent's life in one table (as
#: h11's ``_state.py`` writes a protocol's). ``_enter`` makes no other.
TRANSITIONS: dict[tuple[str, str], str] = {
    (_NEW, _JOINING): "Start: the join is queued",
    (_JOINING, _JOINED): "the join was appended",
    (_JOINED, _JOINING): "Rejoin, this incarnation reported OFFLINE after its join (not by a "
    "supervisor), or a log restored from an older copy: join again in place",
    (_JOINED, _CLOSING): "Close once joined (or the join appended after Close): exit is sent",
    (_NEW, _STOPPED): "Close before Start",
    (_JOINING, _STOPPED): "Close with no join in flight, a join refused for good, fenced",
    (_JOINED, _STOPPED): "fenced (another incarnation, stale_incarnation, a reported death), "
    "a fatal refusal, the group ended",
    (_CLOSING, _STOPPED): "exit appended or refused",
}


class InputRefused(ValueError):
    """An input the machine cannot take, in the phase it is in, or at all: a host's mistake,
    named (the input, the phase, the rule)."""


@dataclass
class _Prepare:
    prepared: Prepared
    offset: int = 0

    @property
    def version(self) -> int:
        return self.prepared.version


@dataclass
class AgentMachine:
    """One rank's agent. ``step(input) -> [action]``; ``next_deadline() -> float | None``."""

    config: AgentConfig
    after: int = 0
    phase: str = _NEW
    view: View | None = None
    own_state: str = OFFLINE
    own_state_reason: str = ""
    last_error: str | None = None
    data_plane_ready: bool = False
    store: StoreAddress | None = None
    moving: bool = False
    _preparing: _Prepare | None = None
    _acked: tuple[int, int] = (0, 0)  # (version, offset) of the last prepare ACKed
    _join_offset: int | None = None
    #: the offset of this incarnation's first join (a rejoin in place keeps it)
    _first_join_offset: int | None = None
    _own_offline_offset: int = 0
    _successor_offset: int = 0
    _successor: str = ""
    _own_state_cause: str | None = None
    _outbox: list[AgentEventBase] = field(default_factory=list)
    _in_flight: tuple[AgentEventBase, ...] | None = None
    #: the heartbeat lane: the beat waiting to be sent, whether one is in flight, its backoff
    _beat: HeartbeatEvent | None = None
    _beat_in_flight: bool = False
    _beat_send_at: float = 0.0
    _beat_backoff_s: float = 0.0
    #: the last links report sent since the join: (down, hint, self_ready, and the view of
    #: its down evidence)
    _last_links: (
        tuple[tuple[int, ...], tuple[int, ...], bool, int | None, tuple[int, int] | None] | None
    ) = None
    _send_at: float = 0.0
    _backoff_s: float = 0.0
    _poll_backoff_s: float = 0.0
    _join_retry_at: float | None = None
    _next_heartbeat: float | None = None
    _close_requested: bool = False
    _shutdown_seen: bool = False

    # -- public surface ------------------------------------------------------------------------

    @property
    def stopped(self) -> bool:
        return self.phase == _STOPPED

    @property
    def joined(self) -> bool:
        return self.phase == _JOINED

    @property
    def awaiting_data_plane(self) -> bool:
        """True until the data plane is ready on the store last advertised."""
        return not self.data_plane_ready or self.moving

    def next_deadline(self) -> float | None:
        """The earliest time at which a Tick may produce something; None if nothing is timed.
        (Asked after every input by hosts that carry many ranks: no list, no generator.)"""
        best = self._next_heartbeat if self.phase == _JOINED else None
        retry = self._join_retry_at
        if retry is not None and (best is None or retry < best):
            best = retry
        if (
            self._in_flight is None
            and self._outbox
            and (self.phase != _JOINING or _has_join(self._outbox))
            and (best is None or self._send_at < best)
        ):
            best = self._send_at
        if (
            self._beat is not None
            and not self._beat_in_flight
            and (best is None or self._beat_send_at < best)
        ):
            best = self._beat_send_at
        return best

    def step(self, event: Input) -> list[Action]:
        """Feed one input; return what the host must do, in order."""
        phase = self.phase
        if phase == _STOPPED:
            return []  # answers to what it sent may still arrive: each changes nothing
        taken = INPUTS.get(type(event))
        if taken is None:
            raise InputRefused(
                f"{type(event).__name__} is not an input of the agent machine; its inputs "
                f"are {', '.join(cls.__name__ for cls in INPUTS)}"
            )
        phases, handler, rule = taken
        if phase not in phases:
            raise InputRefused(
                f"rank {self.config.rank}: {type(event).__name__} in phase {phase!r}: {rule}"
            )
        actions: list[Action] = handler(self, event)
        if self.phase != _STOPPED:
            self._on_timers(event.now)
            actions.extend(self._flush(event.now))
        return actions

    # -- handlers -------------------------------------------------------------------------------

    def _start(self, event: Start) -> list[Action]:
        self._begin_join()
        return [self._poll()]

    def _tick(self, event: Tick) -> list[Action]:
        return []

    def _updates(self, event: UpdatesReceived) -> list[Action]:
        """Fold a batch of updates in order, then act once on the result."""
        self._poll_backoff_s = 0.0
        actions: list[Action] = []
        if event.store is not None and event.store != self.store:
            if self.store is None:
                actions.append(ConnectDataPlane(event.store))
            else:
                self.moving = True
                actions.append(MoveDataPlane(event.store))
            self.store = event.store
        old_view, old_state = self.view, self.own_state
        if event.restored:
            self._forget_newer_log()
        for update in event.updates:
            if update.offset <= self.after and not event.resync:
                continue  # already processed before a reconnect
            on_update = _ON_UPDATE.get(type(update), AgentMachine._on_facet)
            try:
                action = on_update(self, update)
            except (StaleBase, RankSetError) as exc:
                # Only a coordinator restored from an older copy can send a delta that does not
                # fit: start over from its current state.
                self.last_error = f"{update.type}: {exc}; reading the updates again from the start"
                self.view, self._preparing, self.after = None, None, 0
                return [*actions, PollUpdates(0)]
            if action is not None:
                actions.append(action)
        # A resync names where the log now stands, which is behind us after a restore.
        self.after = event.next_after if event.resync else max(self.after, event.next_after)
        if self.view is not None and self.view is not old_view:
            actions.append(InstallView(self.view, self.member_of(self.view)))
        if self.own_state != old_state:
            actions.append(RankStateChanged(self.own_state, self.own_state_reason))
        actions.extend(self._settle_own_state())
        if self.phase == _STOPPED:
            return actions
        if event.restored and self.phase == _JOINED and not self._close_requested:
            self._begin_join()  # the restored log may not know this incarnation
        self._maybe_ack()
        actions.append(self._poll())
        return actions

    def _forget_newer_log(self) -> None:
        """The coordinator's log was restored from an older copy: the view, the prepare and
        every offset this rank learned from the newer log are not the log's any more."""
        self.view, self._preparing = None, None
        self._acked = (0, 0)
        self._join_offset = None if self.phase != _JOINED else 0
        self._first_join_offset = self._join_offset
        self._own_offline_offset = self._successor_offset = 0

    def member_of(self, view: View) -> bool:
        """Whether this incarnation is an active member of ``view``: the view lists its rank
        and was committed after this incarnation first joined. A view committed before (the
        one a replacement reads first, while the coordinator has not yet seen the death of the
        process it replaces) lists the rank for that process: only a later view, after an
        activation, takes this one in. A view that takes it in always comes after its join:
        its prepare waits for this rank's ACK, which follows the join."""
        first = self._first_join_offset
        return first is not None and view.offset > first and view.is_active(self.config.rank)

    def _poll(self, delay_s: float = 0.0) -> PollUpdates:
        return PollUpdates(self.after, delay_s, self.view.version if self.view else None)

    def _poll_failed(self, event: PollFailed) -> list[Action]:
        """The long-poll failed: resume after the same offset once the backoff has passed."""
        self._poll_backoff_s = self._grow(self._poll_backoff_s)
        self.last_error = event.detail
        return [self._poll(self._poll_backoff_s)]

    def _answered(self, event: EventsAnswered) -> list[Action]:
        if event.lane == BEATS:
            return self._beat_answered(event)
        sent, self._in_flight = self._in_flight or (), None
        self._backoff_s = 0.0
        actions: list[Action] = []
        for ev, result in zip(sent, event.results, strict=False):
            error = result.get("error")
            if error is None:
                actions.extend(self._accepted(ev, result, event.now))
            else:
                actions.extend(
                    self._refused(ev, str(error), str(result.get("detail", "")), event.now)
                )
            if self.phase == _STOPPED:
                return actions
        if len(event.results) < len(sent):
            # An answer shorter than the batch: what it did not cover is sent again.
            self._outbox[:0] = list(sent[len(event.results) :])
        return actions

    def _beat_answered(self, event: EventsAnswered) -> list[Action]:
        """A beat's answer: nothing to do unless it was refused (a beat refused as stale or
        invalid ends the agent like any other event; an OFFLINE rank rejoins on its update)."""
        self._beat_in_flight = False
        self._beat_backoff_s = 0.0
        for result in event.results:
            error = result.get("error")
            if error is not None and error != RANK_OFFLINE:
                beat = HeartbeatEvent(**self._envelope)
                return self._refused(beat, str(error), str(result.get("detail", "")), event.now)
        return []

    def _send_failed(self, event: EventsFailed) -> list[Action]:
        """Nothing was delivered: the batch goes back to the front, resent after a backoff (a
        beat is not resent: a newer one falls due anyway)."""
        if event.lane == BEATS:
            self._beat_in_flight = False
            self._beat_backoff_s = self._grow(self._beat_backoff_s)
            self._beat_send_at = event.now + self._beat_backoff_s
            self.last_error = event.detail
            return []
        sent, self._in_flight = self._in_flight or (), None
        keep = [e for e in sent if self.phase != _JOINING or _waits_for_join(e)]
        self._outbox[:0] = keep
        self._backoff_s = self._grow(self._backoff_s)
        self._send_at = event.now + self._backoff_s
        self.last_error = event.detail
        return []

    def _ready(self, event: DataPlaneReady) -> list[Action]:
        """The data plane is ready (on the store last advertised, after a move)."""
        if not self.data_plane_ready:
            self.data_plane_ready = True
            self.moving = False
            if self.phase == _JOINED:
                self._queue_self_ready()
            self._maybe_ack()
        elif self.moving:
            self.moving = False
            self._maybe_ack()
        return []

    def _evidence(self, event: LinkEvidence) -> list[Action]:
        """Report the data plane's evidence; before the join it describes nothing current."""
        if self.phase == _JOINED:
            down = (r for r, status in event.peers.items() if status == "down")
            self._report_links(
                down, event.failed_ranks_hint, self.data_plane_ready, event.version, event.ops
            )
        return []

    def _report_links(
        self,
        down: Any,
        hint: Any,
        ready: bool,
        version: int | None,
        ops: tuple[int, int] | None = None,
    ) -> None:
        """Queue a links report unless it says what the last one since the join said.

        Down evidence is about the view it was found on: the coordinator does not count it
        against a peer whose current process joined after that view, so the same peers found
        down on a newer view are reported again; so is a failure that blamed nobody (``ops``),
        which the coordinator resolves per view (``coordinator.fold.stalls``)."""
        down, hint = tuple(sorted(set(down))), tuple(sorted(set(hint)))
        if down or hint:
            ops = None
        key = (down, hint, ready, version if down or hint or ops else None, ops)
        if key == self._last_links:
            return
        self._last_links = key
        self._outbox.append(
            LinksEvent(**self._envelope, **links_event(down, hint, ready, version, ops))
        )

    def _send_event(self, event: SendEvent) -> list[Action]:
        """Queue a facet's event. Before the join is appended it waits behind it (only the join
        goes first, and a rejoin keeps it); a closing or stopped agent sends nothing more."""
        if event.kind in OWN_EVENTS:
            raise InputRefused(
                f"SendEvent: {event.kind!r} is not a facet's event (it is the agent's own)"
            )
        if self.phase in (_CLOSING, _STOPPED):
            return [EventAnswered(event.kind, dict(event.fields), None, NOT_JOINED, self.phase)]
        try:
            ev = self._facet_event(event)
        except _NotValid as exc:
            # fields the caller chose (a transfer key, a bootstrap value) that do not fit the
            # event's Struct: the caller's refusal, as the coordinator would answer it; the
            # agent goes on (an exception here would end the thread that drives the machine)
            return [EventAnswered(event.kind, dict(event.fields), None, INVALID_EVENT, str(exc))]
        if ev.report:
            # before the join there is nobody to report for; the newest says it all
            if self.phase != _JOINED:
                return [EventAnswered(event.kind, dict(event.fields), None, NOT_JOINED, self.phase)]
            self._outbox = [e for e in self._outbox if type(e) is not type(ev)]
        self._outbox.append(ev)
        return []

    def _rejoin(self, event: Rejoin) -> list[Action]:
        if self.phase == _JOINED:
            self._begin_join()
        return []

    def _close(self, event: Close) -> list[Action]:
        """Leave cleanly: ``exit`` once the join is settled; stop at once if never joined."""
        if self.phase == _CLOSING:
            return []
        self._close_requested = True
        self._join_retry_at = None
        if self.phase == _JOINED:
            self._send_exit()
            return []
        if self.phase == _JOINING and self._in_flight is not None:
            return []  # the join's answer decides: exit after it, or stop
        return self._stop("closed", "closed before joining")

    # -- updates ---------------------------------------------------------------------------------

    def _on_prepare(self, update: ViewPrepareUpdate) -> None:
        if self.view is not None and update.version <= self.view.version:
            return
        prepared = apply_prepare(self.view, update, self.config.world_size)
        self._preparing = _Prepare(prepared, update.offset)

    def _on_committed(self, update: ViewCommittedUpdate) -> None:
        version = update.version
        if update.base == 0:
            base = None  # the full view (a resync, or the group's first view)
        elif self.view is not None and version <= self.view.version:
            return
        else:
            base = self.view
        if base is None and self.view is not None and version < self.view.version:
            return
        self.view = apply_view_update(base, update, self.config.world_size)
        if self._preparing is not None and self._preparing.version <= version:
            self._preparing = None

    def _on_rank_state(self, update: RankStateUpdate) -> None:
        """Track this incarnation's own state, and note when another incarnation takes the rank."""
        if update.rank != self.config.rank:
            return
        offset = update.offset
        incarnation = update.incarnation
        if incarnation != self.config.incarnation:
            if incarnation is not None and offset > self._successor_offset:
                self._successor_offset = offset
                self._successor = (
                    f"rank {self.config.rank} is now incarnation {incarnation} "
                    f"(rank_epoch {update.rank_epoch}); {self.config.incarnation} is stale"
                )
            return
        self.own_state = update.state
        self.own_state_reason = update.reason
        self._own_state_cause = update.cause
        if self.own_state == OFFLINE:
            self._own_offline_offset = offset

    def _on_facet(self, update: Update) -> Action | None:
        """Another facet's update: handed on, unless it names another rank."""
        rank = addressed_rank(update)
        return FacetUpdate(update) if rank in (None, self.config.rank) else None

    def _on_shutdown(self, update: ShutdownUpdate) -> Action | None:
        """The group's directive, acted on once."""
        if self._shutdown_seen:
            return None
        self._shutdown_seen = True
        return ShutdownWithSave(update.reason, update.detail, update.checkpoint_rank)

    def _settle_own_state(self) -> list[Action]:
        """What the coordinator said about this rank since our join, acted on once.

        A newer incarnation of the rank fences us. OFFLINE (a heartbeat or ACK timeout) makes
        us join again in place, unless a supervisor reported this process dead: that verdict
        stands (a replacement is on its way), so we stop instead of contesting the rank.
        """
        joined_at = self._join_offset
        if joined_at is None or self.phase != _JOINED or self._close_requested:
            return []
        if self._successor_offset > joined_at:
            return self._stop("fenced", self._successor)
        if self._own_offline_offset > joined_at:
            if self._own_state_cause == CAUSE_DEATH_REPORTED:
                return self._stop(
                    "fenced",
                    f"rank {self.config.rank}: {self.own_state_reason}; not rejoining "
                    "(a replacement takes the rank)",
                )
            self._begin_join()
        return []

    def _maybe_ack(self) -> None:
        p = self._preparing
        # Once per prepare, not once per version: a change the coordinator withdrew (everyone in
        # it left) is followed by a new prepare of the same version at a later offset.
        if p is None or (p.version, p.offset) <= self._acked or self.phase != _JOINED:
            return
        if not p.prepared.is_participant(self.config.rank):
            return
        if p.prepared.is_active(self.config.rank) and self.awaiting_data_plane:
            return  # ACKed by DataPlaneReady
        self._acked = (p.version, p.offset)
        self._outbox.append(AckEvent(**self._envelope, version=p.version))

    # -- event answers ---------------------------------------------------------------------------

    def _accepted(self, ev: AgentEventBase, result: Mapping[str, Any], now: float) -> list[Action]:
        kind = type(ev)
        if kind is JoinEvent:
            self._join_offset = int(result.get("offset", 0))
            if self._first_join_offset is None:
                self._first_join_offset = self._join_offset
            self._enter(_JOINED)
            self.last_error = None
            if self._close_requested:
                self._send_exit()
                return []
            self._next_heartbeat = now + self.config.heartbeat_interval_s
            if self.data_plane_ready:
                self._queue_self_ready()
            settled = self._settle_own_state()
            if settled:
                return settled
            self._maybe_ack()
        elif kind is ExitEvent:
            return self._stop("closed", f"rank {self.config.rank} left the group")
        elif kind not in _OWN_TYPES:
            offset = result.get("offset")
            return [EventAnswered(_kind(ev), _fields(ev), None if offset is None else int(offset))]
        return []

    def _refused(self, ev: AgentEventBase, error: str, detail: str, now: float) -> list[Action]:
        cls = type(ev)
        kind = _kind(ev)
        if cls not in _OWN_TYPES and error != STALE_INCARNATION:
            return [EventAnswered(kind, _fields(ev), None, error, detail)]
        self.last_error = f"{kind} refused: {error}: {detail}"
        if error == STALE_INCARNATION:
            return self._stop("fenced", self.last_error)
        if error == GROUP_ENDED:  # the run is over: nothing this agent sends is taken again
            return self._stop("closed" if self._close_requested else "failed", self.last_error)
        if error in FATAL_ERRORS:
            return self._stop("failed", self.last_error)
        if cls is JoinEvent:
            if error in RETRIED_JOIN_ERRORS and not self._close_requested:
                self._join_retry_at = now + self.config.join_retry_s
                return []
            return self._stop("failed" if not self._close_requested else "closed", self.last_error)
        if cls is AckEvent and error == STALE_VERSION:
            return []  # the change committed or was dropped without us; the updates say which
        if cls is ExitEvent:
            return self._stop("closed", self.last_error)
        return []

    # -- helpers ---------------------------------------------------------------------------------

    def _begin_join(self) -> None:
        self._enter(_JOINING)
        self._outbox = [e for e in self._outbox if _waits_for_join(e)]
        self._join_retry_at = None
        self._next_heartbeat = None
        self._beat = None
        self._last_links = None  # the join clears this rank's evidence at the coordinator
        if not _has_join(self._outbox):
            self._outbox.insert(0, JoinEvent(**self._envelope))

    def _queue_self_ready(self) -> None:
        version = self.view.version if self.view is not None else 0
        self._report_links((), (), True, version)

    def _send_exit(self) -> None:
        self._enter(_CLOSING)
        self._next_heartbeat = None
        self._beat = None
        self._outbox = [ExitEvent(**self._envelope)]

    @property
    def _envelope(self) -> dict[str, Any]:
        """Whose every event is: this rank's incarnation, in its group."""
        c = self.config
        return {"group": c.group, "rank": c.rank, "incarnation": c.incarnation}

    def _facet_event(self, event: SendEvent) -> AgentEventBase:
        """A facet's event as its Struct (``SendEvent.event_type``, or the protocol's of its
        kind), with this rank's envelope."""
        kind, cls = event.kind, event.event_type or EVENT_TYPES.get(event.kind)
        if cls is None:
            raise InputRefused(
                f"SendEvent: {kind!r} is not an event of the protocol ({sorted(EVENT_TYPES)}); a facet's "
                "event names its Struct (SendEvent.event_type)"
            )
        if _kind_of(cls) != kind:
            raise InputRefused(
                f"SendEvent: {kind!r} is not the type of {cls.__name__} ({_kind_of(cls)!r})"
            )
        try:
            return msgspec.convert({**event.fields, **self._envelope, "type": kind}, cls)
        except msgspec.ValidationError as exc:
            raise _NotValid(f"not a valid {kind!r} event: {exc}") from None

    def _on_timers(self, now: float) -> None:
        if self._join_retry_at is not None and now >= self._join_retry_at:
            self._join_retry_at = None
            joining = self.phase == _JOINING and self._in_flight is None
            if joining and not _has_join(self._outbox):
                self._outbox.insert(0, JoinEvent(**self._envelope))
        if (
            self.phase == _JOINED
            and self._next_heartbeat is not None
            and now >= self._next_heartbeat
        ):
            version = self.view.version if self.view is not None else 0
            # the newest replaces the one waiting
            c = self.config  # the hot path: keywords, not the envelope's dict
            self._beat = HeartbeatEvent(
                group=c.group, rank=c.rank, incarnation=c.incarnation, version=version
            )
            self._next_heartbeat = now + self.config.heartbeat_interval_s

    def _flush(self, now: float) -> list[Action]:
        """Send the outbox as one batch when nothing is in flight and no backoff is pending;
        and the waiting beat in its own lane, likewise."""
        actions: list[Action] = []
        if (
            self._beat is not None
            and not self._beat_in_flight
            and self.phase == _JOINED
            and now >= self._beat_send_at
        ):
            actions.append(SendEvents((self._beat,), BEATS))
            self._beat, self._beat_in_flight = None, True
        return [*self._flush_events(now), *actions]

    def _flush_events(self, now: float) -> list[Action]:
        if self._in_flight is not None or not self._outbox or now < self._send_at:
            return []
        if self.phase == _JOINING:
            # Only the join may go before the join is appended; the rest waits behind it.
            batch = [e for e in self._outbox if type(e) is JoinEvent][:1]
            if not batch:
                return []
            self._outbox = [e for e in self._outbox if type(e) is not JoinEvent]
        else:
            batch, self._outbox = self._outbox, []
        self._in_flight = tuple(batch)
        return [SendEvents(self._in_flight)]

    def _enter(self, phase: str) -> None:
        if (self.phase, phase) not in TRANSITIONS:
            raise RuntimeError(
                f"rank {self.config.rank}: no transition {self.phase} -> {phase} "
                "(agent.machine.TRANSITIONS)"
            )
        self.phase = phase

    def _grow(self, backoff_s: float) -> float:
        c = self.config
        return min(c.retry_max_s, max(c.retry_initial_s, backoff_s * 2))

    def _stop(self, reason: str, detail: str) -> list[Action]:
        self._enter(_STOPPED)
        self._outbox.clear()
        self._beat = None
        self._next_heartbeat = None
        self._join_retry_at = None
        return [Stopped(reason, detail)]


_ALL = frozenset({_NEW, _JOINING, _JOINED, _CLOSING})
_STARTED = frozenset({_JOINING, _JOINED, _CLOSING})
_ASKED = "nothing was asked before Start"
#: Every input the machine takes: the phases it takes it in, its handler, and the rule a host
#: broke when it feeds the input in another phase (``step`` raises :class:`InputRefused` with
#: it). A stopped machine takes every input and does nothing.
INPUTS: dict[type, tuple[frozenset[str], Callable[[AgentMachine, Any], list[Action]], str]] = {
    Start: (frozenset({_NEW}), AgentMachine._start, "a machine starts once"),
    Tick: (_ALL, AgentMachine._tick, ""),
    UpdatesReceived: (_STARTED, AgentMachine._updates, _ASKED),
    PollFailed: (_STARTED, AgentMachine._poll_failed, _ASKED),
    EventsAnswered: (_STARTED, AgentMachine._answered, _ASKED),
    EventsFailed: (_STARTED, AgentMachine._send_failed, _ASKED),
    DataPlaneReady: (_STARTED, AgentMachine._ready, _ASKED),
    LinkEvidence: (_STARTED, AgentMachine._evidence, _ASKED),
    Rejoin: (_ALL, AgentMachine._rejoin, ""),
    Close: (_ALL, AgentMachine._close, ""),
    SendEvent: (_ALL, AgentMachine._send_event, ""),
}

#: What the machine does with the updates it follows itself, by class: the view's, this rank's
#: state and the shutdown directive. Every other update is a facet's, handed on as a
#: ``FacetUpdate`` (``_on_facet``) to whoever follows it: the facet's worker part
#: (``Agent.facet``), or a caller of ``Agent.on_update``.
_ON_UPDATE: dict[type[Update], Callable[[AgentMachine, Any], Action | None]] = {
    ViewPrepareUpdate: AgentMachine._on_prepare,
    ViewCommittedUpdate: AgentMachine._on_committed,
    RankStateUpdate: AgentMachine._on_rank_state,
    ShutdownUpdate: AgentMachine._on_shutdown,
}
_ENVELOPE = frozenset({"type", "group", "rank", "incarnation", "token"})
#: The Structs of the events the machine sends and answers itself (:data:`OWN_EVENTS`).
_OWN_TYPES = frozenset(EVENT_TYPES[kind] for kind in MEMBERSHIP_EVENTS)


def _kind_of(cls: type[AgentEventBase]) -> str:
    """An event Struct's wire ``type``: the kind of the record it becomes."""
    return cls.__struct_config__.tag  # type: ignore[attr-defined,return-value]


def _kind(ev: AgentEventBase) -> str:
    return _kind_of(type(ev))


def _has_join(events: list[AgentEventBase]) -> bool:
    return any(type(e) is JoinEvent for e in events)


def _waits_for_join(ev: AgentEventBase) -> bool:
    """Whether an event stays queued through a (re)join: the join itself, and a facet's event,
    whose caller waits for its answer, but a report (the agent's own, and a facet's reports,
    are made again after the join)."""
    return type(ev) is JoinEvent or (type(ev) not in _OWN_TYPES and not ev.report)


def _fields(ev: AgentEventBase) -> dict[str, Any]:
    """A facet's event as its sender gave it: its fields, without the envelope."""
    return {k: v for k, v in msgspec.to_builtins(ev).items() if k not in _ENVELOPE}
