"""The lighthouse facet's fold: torchft's quorum rule over the log.

torchft's lighthouse (``src/lighthouse.rs``) keeps, in one process's memory, who heartbeats,
who asks for a quorum and the last quorum, and decides each quorum with ``quorum_compute``.
Here the same facts are records, and the same rule is a pure function of them
(:func:`quorum_compute`): a quorum is decided by the fold, at the step of a record, so
``replay`` decides every quorum again, identically, and a standby that takes over holds the
lighthouse's whole state.

The records (none names a group or a rank; the lighthouse is the coordinator's):

=========================  ================================================================
``lighthouse_configured``  the rule's settings (``effects.Settings``), appended by the
                           serving coordinator when the log holds other ones
``lighthouse_request``     a replica group asks for a quorum: its ``QuorumMember`` (also a
                           heartbeat)
``lighthouse_heartbeat``   the replica groups that heartbeat within one flush interval, in
                           one shared record (``{"replicas": [ids]}``)
``lighthouse_lost``        a launcher saw replica group ``replica`` die (``reason``): every
                           incarnation of it (``replica`` or ``replica:<uuid>``) is out at
                           once, without waiting out its heartbeat timeout
``lighthouse_withdrawn``   the call that made request ``request`` of ``replica_id`` ended
                           unanswered (the caller's deadline, a cancel): it asks no more
=========================  ================================================================

Time is the records' ``ts``; a ``tick`` is appended when :meth:`Lighthouse.next_deadline`
(a heartbeat running out, the join timeout) has passed, no sooner than ``quorum_tick_ms``
after the previous one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ...coordinator.fold.effects import Effect, View
from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.state import GroupState
from ...eventlog import Record
from .checks import input_refusal
from .effects import (
    LighthouseConfigured,
    QuorumDecided,
    ReplicaLost,
    Settings,
)
from .inputs import (
    CONFIGURED,
    HEARTBEAT,
    LOST,
    REQUEST,
    WITHDRAWN,
    HeartbeatInput,
    LostInput,
    WithdrawnInput,
    decode,
)
from .messages import (
    QuorumMember,
)
from .quorum import _MS, Decision, LastQuorum, Request, quorum_compute
from .reads import LighthouseReads

#: A lost incarnation's id is refused for this many heartbeat timeouts after its loss (a
#: beat still in flight from the dead process), then forgotten, so the set stays bounded.
LOST_KEPT_TIMEOUTS = 10
#: A replica group silent for this many heartbeat timeouts is forgotten.
SILENT_KEPT_TIMEOUTS = 10


#: The transition table: each input (``inputs.py``), the rule that steps it and what it moves;
#: then the quorum is decided (a fact may complete one).
TRANSITIONS: dict[type, str] = {
    Settings: "_on_configured",  # the rule's settings
    QuorumMember: "_on_request",  # a replica group asks for a quorum (and beats)
    HeartbeatInput: "_on_heartbeat",  # replica groups beat (a lost incarnation's beat: nothing)
    LostInput: "_on_lost",  # every incarnation of a replica group is out
    WithdrawnInput: "_on_withdrawn",  # a pending request is withdrawn
}


class Lighthouse:
    """The ``lighthouse`` facet (``coordinator.fold.facets.Facet``): see the module docstring."""

    name = "lighthouse"
    kinds = frozenset({CONFIGURED, REQUEST, HEARTBEAT, LOST, WITHDRAWN})
    repeatable: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.settings: Settings | None = None
        #: replica id -> its last heartbeat (ns), oldest first
        self.beats: dict[str, int] = {}
        #: replica id -> its pending request
        self.requests: dict[str, Request] = {}
        self.last: LastQuorum | None = None
        self.quorum_id = 0
        #: replica id -> (the offset of the record that lost it, its time)
        self.lost: dict[str, tuple[int, int]] = {}
        #: the rule's last answer (why no quorum yet, or the last one's reason)
        self.status = "no replica group has asked for a quorum"
        self.now = 0
        self._last_tick = 0
        #: whether a record reached the facet since the last read model (``reads.py``)
        self._moved = True

    # -- reading -----------------------------------------------------------------------------

    def read_model(self, previous: LighthouseReads | None) -> LighthouseReads:
        """See ``coordinator.fold.facets.Facet.read_model`` and ``reads.py``."""
        if previous is None:
            return LighthouseReads(self)
        if not self._moved:
            return previous
        self._moved = False
        return LighthouseReads(self)

    def decision(self, now: int | None = None) -> Decision | None:
        """What the rule says at ``now`` (the fold's time by default), or None unconfigured."""
        if self.settings is None:
            return None
        when = self.now if now is None else now
        return quorum_compute(when, self.requests, self.beats, self.last, self.settings, self.lost)

    def awaited(self, now: int, asking: frozenset[str] | set[str] = frozenset()) -> list[str]:
        """The members of the last quorum that a fast quorum still waits for at ``now``: those
        heartbeating within the timeout, not reported lost, and not asking yet (neither a
        pending request here nor one of ``asking``). Empty: no fast quorum is to come, or
        every member of it has asked."""
        settings, last = self.settings, self.last
        if settings is None or last is None:
            return []
        timeout = settings.heartbeat_timeout_ms * _MS
        return [
            r
            for r in last.replica_ids
            if r not in self.requests
            and r not in asking
            and r not in self.lost
            and now - self.beats.get(r, now - timeout) < timeout
        ]

    def gather_until(self, now: int, asking: Sequence[QuorumMember], bound_ns: int) -> int | None:
        """Until when (ns) the requests ``asking``, not in the log yet, may wait for the rest of
        the last quorum (``LighthouseHost._gather``), so that the request that completes a fast
        quorum is appended with them; None: append them now.

        They wait only while that changes no decision: while a member of the last quorum is
        :meth:`awaited` (the fast quorum is decided at its request, not before), while they
        would not decide a quorum by themselves now, and never past the next moment the rule's
        answer could change with no new record (a heartbeat or the join timeout running out,
        counting theirs); and at most ``bound_ns``."""
        settings = self.settings
        if settings is None or not self.awaited(now, {m.replica_id for m in asking}):
            return None
        requests = dict(self.requests)
        beats = dict(self.beats)
        for m in asking:
            requests[m.replica_id] = Request(member=m, joined=now, offset=0)
            beats.pop(m.replica_id, None)
            beats[m.replica_id] = now
        decision = quorum_compute(now, requests, beats, self.last, settings, self.lost)
        if decision.participants is not None:
            return None
        change = _next_change(now, requests, beats, settings)
        return now + bound_ns if change is None else min(now + bound_ns, change)

    def lost_at(self, replica_id: str) -> int | None:
        """The offset that lost this incarnation, or None."""
        entry = self.lost.get(replica_id)
        return None if entry is None else entry[0]

    # -- the Facet protocol ------------------------------------------------------------------

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        """See ``checks.input_refusal``: it reads the rule's settings and the lost ids."""
        return input_refusal(kind, group, rank, payload, self.settings, self.lost)

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        return None

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Record the fact, then decide (a fact may complete a quorum)."""
        self._moved = True
        self.now = fold.now
        inp = decode(record.kind, record.payload)
        getattr(self, TRANSITIONS[type(inp)])(inp, record, effects)
        self._decide(record, effects)

    def _on_configured(self, settings: Settings, record: Record, effects: list[Effect]) -> None:
        self.settings = settings
        effects.append(LighthouseConfigured(settings=settings, offset=record.offset))

    def _on_request(self, member: QuorumMember, record: Record, effects: list[Effect]) -> None:
        rid = member.replica_id
        self._beat(rid, self.now)
        self.requests[rid] = Request(member=member, joined=self.now, offset=record.offset)

    def _on_heartbeat(self, beat: HeartbeatInput, record: Record, effects: list[Effect]) -> None:
        for rid in beat.replicas:
            if rid not in self.lost:  # a dead incarnation's beat still in flight
                self._beat(rid, self.now)

    def _on_lost(self, lost: LostInput, record: Record, effects: list[Effect]) -> None:
        self._lose(lost.replica, lost.reason, record, effects)

    def _on_withdrawn(
        self, withdrawn: WithdrawnInput, record: Record, effects: list[Effect]
    ) -> None:
        pending = self.requests.get(withdrawn.replica_id)
        if pending is not None and pending.offset == withdrawn.request:
            del self.requests[withdrawn.replica_id]

    def _beat(self, rid: str, now: int) -> None:
        self.beats.pop(rid, None)  # oldest first: the forgetting below stops at the first kept
        self.beats[rid] = now

    def _lose(self, name: str, reason: str, record: Record, effects: list[Effect]) -> None:
        """Every known incarnation of ``name`` (``name`` itself, or ``name:<uuid>`` as torchft's
        manager names a replica group) is out: no heartbeat, no request. Its id is refused
        for a while after (:data:`LOST_KEPT_TIMEOUTS`)."""
        prefix = name + ":"
        known = sorted(
            r for r in set(self.beats) | set(self.requests) if r == name or r.startswith(prefix)
        )
        for rid in known:
            self.beats.pop(rid, None)
            self.requests.pop(rid, None)
            self.lost[rid] = (record.offset, self.now)
        effects.append(
            ReplicaLost(replica=name, replica_ids=tuple(known), reason=reason, offset=record.offset)
        )

    def _decide(self, record: Record, effects: list[Effect]) -> None:
        """Run the rule when someone waits; issue the quorum it finds.

        The quorum id goes up only when the participants differ from the last quorum's, or
        when one of them reports commit failures (torchft's rule: an unchanged quorum keeps its
        id, so its members keep their process groups). The participants' requests are
        answered; a request left out stays pending from now (torchft's waiter asks again) if
        its replica group is healthy, and is dropped if not (its heartbeats stopped: no live
        caller waits on it)."""
        settings = self.settings
        if settings is None or not self.requests:
            return
        decision = quorum_compute(
            self.now, self.requests, self.beats, self.last, settings, self.lost
        )
        self.status = decision.reason
        if decision.participants is None:
            return
        chosen = decision.participants
        taken = [self.requests[r] for r in chosen]
        failures = any(req.member.commit_failures > 0 for req in taken)
        changed = self.last is None or self.last.replica_ids != chosen
        if changed or failures:
            self.quorum_id += 1
        self.last = LastQuorum(
            quorum_id=self.quorum_id, replica_ids=chosen, offset=record.offset, ts=self.now
        )
        timeout = settings.heartbeat_timeout_ms * _MS
        left: dict[str, Request] = {}
        for rid, req in self.requests.items():
            if rid not in chosen and self.now - self.beats.get(rid, -timeout) < timeout:
                left[rid] = msgspec.structs.replace(req, joined=self.now)
        self.requests = left
        effects.append(
            QuorumDecided(
                quorum_id=self.quorum_id,
                changed=changed or failures,
                participants=tuple(req.member for req in taken),
                requests=tuple(req.offset for req in taken),
                reason=decision.reason,
                verdicts=decision.verdicts,
                created=self.now,
                offset=record.offset,
            )
        )
        self._forget()

    def _forget(self) -> None:
        """Forget what can no longer matter: lost ids past :data:`LOST_KEPT_TIMEOUTS`, and
        replica groups silent past :data:`SILENT_KEPT_TIMEOUTS` (unless they wait)."""
        if self.settings is None:
            return
        timeout = self.settings.heartbeat_timeout_ms * _MS
        for rid in [
            r for r, (_, t) in self.lost.items() if self.now - t > LOST_KEPT_TIMEOUTS * timeout
        ]:
            del self.lost[rid]
        silent = []
        for rid, t in self.beats.items():
            if self.now - t <= SILENT_KEPT_TIMEOUTS * timeout:
                break
            if rid not in self.requests:
                silent.append(rid)
        for rid in silent:
            del self.beats[rid]

    def view_committed(
        self,
        fold: FoldContext,
        g: GroupState,
        view: View,
        base: View | None,
        record: Record,
        effects: list[Effect],
    ) -> None:
        pass

    def rank_lost(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        pass

    def rank_joined(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        pass

    def tick(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Time passed: a heartbeat may have run out, or the join timeout."""
        self._moved = True
        self.now = fold.now
        if self.requests:
            self._last_tick = self.now
            self._decide(record, effects)

    def next_deadline(self) -> int | None:
        """While someone waits and no quorum is issued: the next time the rule's answer can
        change with no new record (a heartbeat running out, the join timeout running out), but
        no sooner than ``quorum_tick_ms`` after the last tick."""
        settings = self.settings
        if settings is None or not self.requests:
            return None
        change = _next_change(self.now, self.requests, self.beats, settings)
        if change is None:
            return None
        return max(change, self._last_tick + settings.quorum_tick_ms * _MS)

    def waits_on_ranks(self) -> bool:
        return bool(self.beats or self.requests)

    def resume(self, now: int) -> None:
        """The coordinator (re)started serving at ``now``: no replica group could reach it
        while none served, so every heartbeat counts from ``now``; and the calls that held the
        pending requests ended with the coordinator that served them (a caller still alive asks
        again, through this one)."""
        self._moved = True
        self.now = max(self.now, now)
        for rid in self.beats:
            self.beats[rid] = now
        self.requests = {}

    def snapshot(self) -> dict[str, Any]:
        return {
            "settings": None if self.settings is None else msgspec.to_builtins(self.settings),
            "beats": [[r, t] for r, t in self.beats.items()],
            "requests": [msgspec.to_builtins(req) for req in self.requests.values()],
            "last": None if self.last is None else msgspec.to_builtins(self.last),
            "quorum_id": self.quorum_id,
            "lost": [[r, o, t] for r, (o, t) in self.lost.items()],
            "status": self.status,
            "now": self.now,
            "last_tick": self._last_tick,
        }

    def restore(self, data: dict[str, Any]) -> None:
        settings = data["settings"]
        self.settings = None if settings is None else msgspec.convert(settings, Settings)
        self.beats = {r: t for r, t in data["beats"]}
        requests = [msgspec.convert(req, Request) for req in data["requests"]]
        self.requests = {req.member.replica_id: req for req in requests}
        last = data["last"]
        self.last = None if last is None else msgspec.convert(last, LastQuorum)
        self.quorum_id = data["quorum_id"]
        self.lost = {r: (o, t) for r, o, t in data["lost"]}
        self.status = data["status"]
        self.now = data["now"]
        self._last_tick = data["last_tick"]
        self._moved = True


def _next_change(
    now: int, requests: dict[str, Request], beats: dict[str, int], settings: Settings
) -> int | None:
    """The next time after ``now`` that :func:`quorum_compute` can answer otherwise with no new
    record: a heartbeat running out, or the join timeout of the first healthy request."""
    timeout = settings.heartbeat_timeout_ms * _MS
    due = [t + timeout for t in beats.values() if t + timeout > now]
    joined = [
        req.joined + settings.join_timeout_ms * _MS
        for rid, req in requests.items()
        if now - beats.get(rid, -timeout) < timeout
    ]
    if joined and min(joined) > now:
        due.append(min(joined))
    return min(due) if due else None
