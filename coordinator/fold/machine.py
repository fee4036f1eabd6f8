"""The Coordinator: a pure, deterministic fold over the log.

``Coordinator.step(record) -> effects`` mutates the machine in place (h11-style) and returns
what the host must carry out. It does no I/O and reads no clock: time is the record's ``ts``
(clamped so it never runs backwards), and the host appends a ``tick`` once ``next_deadline()``
has passed. Iteration is always in a fixed order, so replaying a log gives byte-identical
effects, and ``snapshot()`` + the tail gives exactly what a full replay gives.

A step has two halves:

* a *handler* per record kind records the fact (a rank joined, beat, reported links, ACKed,
  exited, died; a proposal arrived; time passed) and runs the *death chain* when a rank is lost;
* :meth:`Coordinator._settle` then makes every decision that the new facts allow, in one fixed
  order: recompute the Healthy Set (unless a reconciliation window is open), enforce the failure
  budget, commit the change in flight once its barrier is complete, and otherwise start the next
  change: formation, then auto-deactivation, then the head of the proposal queue.

Heartbeats take a fast path that changes only liveness, so they never reach ``_settle``.

State beside membership lives in *facets* (``coordinator/fold/facets.py``): epoch plans
(``epochs.py``) and weight refits (``refits.py``). A record of a facet's kind is checked and
stepped by the facet; every facet hears of each committed view, each rank lost and each tick at
fixed points of a step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import msgspec

from coordinator.fold.admission import admission_problem, requested, static_problem
from coordinator.fold.config import GroupConfig
from coordinator.fold.effects import (
    HEALTHY,
    OFFLINE,
    SYNCED,
    Effect,
    GroupCreated,
    GroupFailed,
    Proposal,
    ProposalAccepted,
    ProposalResolved,
    RankState,
    Refused,
    ShutdownWithSave,
    View,
    ViewCommitted,
    ViewPrepare,
)
from coordinator.fold.epochs import Epochs
from coordinator.fold.facets import Facet
from coordinator.fold.fencing import (
    REPEATABLE,
    beats_not_current,
    current_beat,
    parse_group_created,
    refusal,
    repeat_of,
)
from coordinator.fold.healthy_set import excluded_ranks
from coordinator.fold.reasons import ranks_text
from coordinator.fold.refits import Refits
from coordinator.fold.state import FAILED, FORMED, FORMING, Change, GroupState
from coordinator.fold.status import group_status
from eventlog.record import Record
from wire import ranks as rank_sets
from wire.codes import (
    APPLIED,
    APPLIED_WITH_DROPPED_RANKS,
    PENDING,
    REJECTED,
)
from wire.protocol import CAUSE_DEATH_REPORTED, links_down

#: Format 2 adds the facets' state, format 3 each rank's ``joined_version``; a snapshot of an
#: older format still restores (without facets; every links report counting, as it then did).
SNAPSHOT_FORMAT = 3
_READABLE_FORMATS = (1, 2, 3)


class Coordinator:
    """The fold. See the module docstring for the shape of a step."""

    def __init__(self) -> None:
        self._offset = 0
        self._now = 0
        self._groups: dict[str, GroupState] = {}
        self._proposals: dict[int, Proposal] = {}
        self._handlers = {
            "group_created": self._on_group_created,
            "join": self._on_join,
            "links": self._on_links,
            "ack": self._on_ack,
            "exit": self._on_exit,
            "death_reported": self._on_death_reported,
            "proposal": self._on_proposal,
        }
        self.epochs = Epochs()
        self.refits = Refits()
        #: the facets, in the fixed order their hooks run
        self.facets: tuple[Facet, ...] = (self.epochs, self.refits)
        self._facet_of: dict[str, Facet] = {k: f for f in self.facets for k in f.kinds}
        #: the kinds :meth:`repeat_of` may find an earlier input for
        self.repeatable: frozenset[str] = REPEATABLE.union(*(f.repeatable for f in self.facets))

    # ------------------------------------------------------------------ what facets read

    @property
    def now(self) -> int:
        """The fold's time (ns): the largest record ``ts`` seen."""
        return self._now

    @property
    def group_states(self) -> dict[str, GroupState]:
        """Every group's internal state (facets read it; nothing outside the fold should)."""
        return self._groups

    # ------------------------------------------------------------------ stepping

    @property
    def offset(self) -> int:
        """Offset of the last record applied (0 before any)."""
        return self._offset

    def step(self, record: Record) -> list[Effect]:
        """Apply one record; return its effects. Records must come in increasing offset order."""
        offset = record.offset
        if offset <= self._offset:
            raise ValueError(
                f"record offset {offset} is not after the fold's offset {self._offset}; "
                "records must be stepped in increasing offset order"
            )
        self._offset = offset
        now = record.ts
        if now > self._now:
            self._now = now
        else:
            now = self._now
        kind = record.kind
        if kind == "heartbeat":
            # Fast path: a beat from the current incarnation of an online rank (exactly the
            # ranks in ``alive``) only moves the rank to the back of the liveness order.
            # Anything else takes the checked path below and is refused with a reason.
            g = self._groups.get(record.group)  # type: ignore[arg-type]
            if g is not None:
                rank = record.rank
                if rank is None and "ranks" in record.payload:
                    return self._on_shared_heartbeat(g, record, now)
                alive = g.alive
                if rank in alive and g.ranks[rank].incarnation == record.payload.get("incarnation"):
                    alive.move_to_end(rank)  # type: ignore[arg-type]
                    alive[rank] = now  # type: ignore[index]
                    return []
            refusal = self._refusal(kind, record.group, record.rank, record.payload)
            return [self._refused(record, refusal)] if refusal else []
        if kind == "tick":
            return self._on_tick(record)
        refusal = self._refusal(kind, record.group, record.rank, record.payload)
        if refusal is not None:
            return [self._refused(record, refusal)]
        effects: list[Effect] = []
        facet = self._facet_of.get(kind)
        if facet is not None:
            facet.apply(self, record, effects)
            return effects
        self._handlers[kind](record, effects)
        g = self._groups.get(record.group)  # type: ignore[arg-type]
        if g is not None:
            self._settle(g, record, effects)
        return effects

    def check(
        self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> Refused | None:
        """Would ``step`` refuse this input now? The host runs this before appending, so a
        refused input never reaches the log. The Refused carries offset 0: nothing was logged."""
        refusal = self._refusal(kind, group, rank, payload)
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
            return facet.repeat_of(self, kind, group, rank, payload)
        return repeat_of(self._groups, self._proposals, kind, group, rank, payload)

    def next_deadline(self) -> int | None:
        """The earliest pending deadline (ns), or None. The host appends a tick once now >= it.

        Every deadline reported here is one that a tick at or after it resolves, so the host
        never spins on a deadline in the past.
        """
        best: int | None = None
        for g in self._groups.values():
            d = self._group_deadline(g)
            if d is not None and (best is None or d < best):
                best = d
        for facet in self.facets:
            d = facet.next_deadline()
            if d is not None and (best is None or d < best):
                best = d
        return best

    def waits_on_ranks(self) -> bool:
        """Whether a deadline waits on the ranks (an online rank's heartbeat, a change's ACKs,
        a queued proposal): what a resumed tick restarts, so a host that finds none need not
        append one."""
        return any(
            g.alive or g.change is not None or g.queue for g in self._groups.values()
        ) or any(f.waits_on_ranks() for f in self.facets)

    # ------------------------------------------------------------------ snapshots

    def snapshot(self) -> dict[str, Any]:
        """The whole state as JSON-able data, at ``offset``. Restoring it and stepping the tail
        gives exactly what a full replay gives."""
        return {
            "format": SNAPSHOT_FORMAT,
            "offset": self._offset,
            "now": self._now,
            "groups": [self._groups[name].to_dict() for name in self._groups],
            "proposals": [msgspec.to_builtins(p) for p in self._proposals.values()],
            "facets": {f.name: f.snapshot() for f in self.facets},
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> Coordinator:
        """Restore a machine from :meth:`snapshot` (also after a JSON round trip)."""
        if data.get("format") not in _READABLE_FORMATS:
            raise ValueError(
                f"snapshot format {data.get('format')!r} is not one of {_READABLE_FORMATS}; "
                "rebuild the fold by replaying the log"
            )
        m = cls()
        m._offset = data["offset"]
        m._now = data["now"]
        for item in data["groups"]:
            g = GroupState.from_dict(item)
            m._groups[g.name] = g
        for item in data["proposals"]:
            p = msgspec.convert(item, Proposal)
            m._proposals[p.id] = p
        facets = data.get("facets", {})
        for facet in m.facets:
            if facet.name in facets:
                facet.restore(facets[facet.name])
        return m

    # ------------------------------------------------------------------ queries

    def groups(self) -> list[str]:
        return sorted(self._groups)

    def group_config(self, group: str) -> GroupConfig | None:
        g = self._groups.get(group)
        return None if g is None else g.config

    def current_view(self, group: str) -> View | None:
        g = self._groups.get(group)
        return None if g is None else g.view

    def proposal(self, id: int) -> Proposal | None:
        return self._proposals.get(id)

    def proposal_by_key(self, group: str, idempotency_key: str) -> Proposal | None:
        g = self._groups.get(group)
        if g is None or idempotency_key not in g.keys:
            return None
        return self._proposals[g.keys[idempotency_key]]

    def group_status(self, group: str) -> dict[str, Any] | None:
        """Plain data for ``GET /groups/{group}``; None for an unknown group."""
        g = self._groups.get(group)
        return None if g is None else group_status(g)

    # ------------------------------------------------------------------ validation and fencing

    def _refusal(
        self, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> tuple[str, str] | None:
        facet = self._facet_of.get(kind)
        if facet is not None:
            return facet.refusal(self, kind, group, rank, payload)
        return refusal(self._groups, self._proposals, self._now, kind, group, rank, payload)

    def _refused(self, record: Record, refusal: tuple[str, str]) -> Refused:
        code, message = refusal
        return Refused(
            group=record.group,
            rank=record.rank,
            kind=record.kind,
            code=code,
            message=message,
            offset=record.offset,
        )

    # ------------------------------------------------------------------ handlers (facts)

    def _on_group_created(self, record: Record, effects: list[Effect]) -> None:
        """A new group starts FORMING; creating an identical group again changes nothing."""
        group = record.group
        assert group is not None
        if group in self._groups:
            return
        config = parse_group_created(record.payload)
        self._groups[group] = GroupState(group, config, self._now, record.offset)
        effects.append(GroupCreated(group=group, config=config, offset=record.offset))

    def _on_join(self, record: Record, effects: list[Effect]) -> None:
        """An OFFLINE rank, or a new incarnation, becomes SYNCED (not yet self-ready).

        A new incarnation bumps ``rank_epoch``, replaces the old one through the death chain if
        it was still online, and clears its own link evidence *and* every other rank's down
        evidence about it: the replacement is a new process. The same incarnation joining again
        while online is only a sign of life.
        """
        g = self._groups[record.group]  # type: ignore[index]
        rank = record.rank
        assert rank is not None
        info = g.ranks[rank]
        payload = record.payload
        inc = payload["incarnation"]
        info.host = payload.get("host", info.host)
        info.pid = payload.get("pid", info.pid)
        if inc == info.incarnation:
            if info.state != OFFLINE:
                self._touch(g, rank)
                return
            reason = f"rejoined as the same incarnation {inc} (rank_epoch {info.rank_epoch})"
        else:
            if info.state != OFFLINE:
                self._go_offline(
                    g,
                    rank,
                    f"incarnation {info.incarnation} replaced by {inc}",
                    True,
                    record,
                    effects,
                )
            info.incarnation = inc
            info.rank_epoch += 1
            info.failure_counted = False
            info.joined_version = g.version
            self._forget_evidence_about(g, rank)
            reason = f"joined as incarnation {inc} (rank_epoch {info.rank_epoch})"
        info.state = SYNCED
        g.fence_epoch += 1
        info.exited = False
        self._set_evidence(g, rank, frozenset(), False)
        self._touch(g, rank)
        self._rank_state(g, rank, reason, record, effects)

    def _on_shared_heartbeat(self, g: GroupState, record: Record, now: int) -> list[Effect]:
        """The beats of many ranks that arrived together, in one record: each listed rank that
        is online is alive as of the record's time. The host checked every beat against this
        very state before appending (a stale incarnation never gets into the record); a rank
        that is not online here (a malformed or hand-written record) is passed over."""
        refusal = self._refusal("heartbeat", record.group, None, record.payload)
        if refusal is not None:
            return [self._refused(record, refusal)]
        alive = g.alive
        for rank in rank_sets.decode(record.payload["ranks"], g.cfg.world_size):
            if rank in alive:
                alive.move_to_end(rank)
                alive[rank] = now
        return []

    def _on_links(self, record: Record, effects: list[Effect]) -> None:
        """A rank's latest links report replaces its previous one.

        Down evidence (a peer reported down, a failure hint, or the rank saying it is not
        self-ready) opens the reconciliation window, so hints from several ranks are decided
        together; up evidence is applied at once unless a window is open.

        A report says which view its evidence comes from (``version``: the view whose group
        the failed operation or the probe ran on). It names a peer down only if that view is
        newer than the one committed when the peer's current incarnation joined: an operation
        on an older view ran with the peer's previous process, so its failure (often reported
        late, at the collective timeout) says nothing about the replacement. The join already
        forgot the evidence about the old process that had arrived; this keeps what arrives
        after the join from bringing it back.
        """
        g = self._groups[record.group]  # type: ignore[index]
        rank = record.rank
        assert rank is not None
        payload = record.payload
        if "peers" in payload or "failed_ranks_hint" in payload:  # a protocol-1 record
            peers = payload.get("peers", {})
            down = {int(p) for p, status in peers.items() if status == "down"}
            down.update(payload.get("failed_ranks_hint") or ())
        else:
            down = set(links_down(payload, g.cfg.world_size))
            about = payload.get("version")
            if about is not None:
                down = {p for p in down if about > g.ranks[p].joined_version}
        down.discard(rank)
        self._touch(g, rank)
        info = g.ranks[rank]
        new_down = frozenset(down)
        ready = payload["self_ready"]
        if new_down == info.down and ready == info.self_ready:
            return
        worse = bool(new_down - info.down) or (info.self_ready and not ready)
        self._set_evidence(g, rank, new_down, ready)
        if worse and g.window_end is None and g.cfg.reconcile_window_ns > 0:
            g.window_end = self._now + g.cfg.reconcile_window_ns

    def _on_ack(self, record: Record, effects: list[Effect]) -> None:
        """A participant ACKs the version being prepared (a repeated ACK changes nothing)."""
        g = self._groups[record.group]  # type: ignore[index]
        assert g.change is not None and record.rank is not None
        g.change.acked.add(record.rank)
        g.change.waiting.discard(record.rank)
        self._touch(g, record.rank)

    def _on_exit(self, record: Record, effects: list[Effect]) -> None:
        """A clean exit: OFFLINE and marked exited; it never counts against ``max_failure``."""
        g = self._groups[record.group]  # type: ignore[index]
        rank = record.rank
        assert rank is not None
        info = g.ranks[rank]
        if info.state == OFFLINE:
            info.exited = True
            return
        info.exited = True
        self._go_offline(g, rank, "exited cleanly", False, record, effects)

    def _on_death_reported(self, record: Record, effects: list[Effect]) -> None:
        """A supervisor's death report takes the same death chain as a heartbeat timeout."""
        g = self._groups[record.group]  # type: ignore[index]
        rank = record.rank
        assert rank is not None
        if g.ranks[rank].state == OFFLINE:
            return
        reporter = record.payload.get("reporter")
        by = f" by {reporter}" if reporter else ""
        self._go_offline(
            g, rank, f"death reported{by}", True, record, effects, cause=CAUSE_DEATH_REPORTED
        )

    def _on_proposal(self, record: Record, effects: list[Effect]) -> None:
        """A proposal is logged and queued (first in, first out); ``_settle`` decides it.

        A group that failed to form or was shut down rejects it at once.
        """
        g = self._groups[record.group]  # type: ignore[index]
        payload = record.payload
        proposal = Proposal(
            id=record.offset,
            group=g.name,
            op=payload["op"],
            ranks=tuple(payload["ranks"]),
            proposer=payload.get("proposer"),
            idempotency_key=payload.get("idempotency_key"),
            status=PENDING,
            version=None,
            reason="queued",
            dropped_ranks=(),
            offset=record.offset,
            resolved_offset=None,
        )
        self._proposals[proposal.id] = proposal
        if proposal.idempotency_key is not None:
            g.keys[proposal.idempotency_key] = proposal.id
        effects.append(ProposalAccepted(proposal=proposal, offset=record.offset))
        if g.formation == FAILED:
            self._resolve(
                g,
                proposal.id,
                REJECTED,
                None,
                f"group failed to form: {g.formation_error}",
                record,
                effects,
            )
        elif g.shutdown is not None:
            self._resolve(
                g,
                proposal.id,
                REJECTED,
                None,
                f"group was shut down ({g.shutdown})",
                record,
                effects,
            )
        else:
            g.queue.append((proposal.id, self._now + g.cfg.admission_timeout_ns))

    def _on_tick(self, record: Record) -> list[Effect]:
        """Time passed: fire every deadline that is due, group by group in name order.

        A tick with payload ``{"resumed": true}`` says the coordinator (re)started serving: the
        deadlines that measure the ranks' silence restart first (see :meth:`_resume`)."""
        effects: list[Effect] = []
        now = self._now
        if record.payload.get("resumed") is True:
            self._resume()
        for name in sorted(self._groups):
            g = self._groups[name]
            due = self._group_deadline(g)
            if due is None or due > now:
                continue
            self._expire_heartbeats(g, record, effects)
            if g.window_end is not None and g.window_end <= now:
                g.window_end = None
            change = g.change
            if change is not None and change.ack_deadline <= now:
                for rank in change.outstanding():
                    self._go_offline(
                        g,
                        rank,
                        f"did not ACK version {change.version} by its deadline {change.ack_deadline}",
                        True,
                        record,
                        effects,
                    )
            if g.formation == FORMING and g.change is None and g.shutdown is None:
                deadline = g.created_ts + g.cfg.formation_timeout_ns
                if deadline <= now:
                    self._fail_formation(g, deadline, record, effects)
            if g.formation == FORMING:
                self._expire_unformed_heads(g, record, effects)
            self._settle(g, record, effects)
        for facet in self.facets:
            facet.tick(self, record, effects)
        return effects

    def _resume(self) -> None:
        """The coordinator was not serving for a while (a restart, a failover): nobody could
        send a heartbeat, an ACK or a ready report to it, so silence during the outage is the
        coordinator's, not the ranks'. Every deadline that waits for the ranks restarts at the
        resumed tick's time: each online rank's heartbeat deadline, the ACK deadline of the
        change in flight, and the admission deadlines of queued proposals. The formation
        deadline (a bound on the whole start-up) and an open reconciliation window (a delay
        for more evidence, not a wait on anyone) keep running."""
        now = self._now
        for name in sorted(self._groups):
            g = self._groups[name]
            for rank in g.alive:
                g.alive[rank] = now
            if g.change is not None:
                g.change.ack_deadline = now + g.cfg.ack_timeout_ns
            g.queue = deque((pid, now + g.cfg.admission_timeout_ns) for pid, _ in g.queue)
        for facet in self.facets:
            facet.resume(now)

    # ------------------------------------------------------------------ the death chain

    def _go_offline(
        self,
        g: GroupState,
        rank: int,
        reason: str,
        failure: bool,
        record: Record,
        effects: list[Effect],
        *,
        cause: str | None = None,
    ) -> None:
        """Every way a rank is lost ends here: heartbeat timeout, death report, a missed ACK,
        replacement by a new incarnation, and (with ``failure=False``) a clean exit.

        The rank goes OFFLINE, leaves the usable-edge graph and the Healthy Set, stops being
        awaited by the change in flight (dropped at once rather than at the ACK deadline, or,
        after a clean exit, leaving the view without being dropped), and a failure of a non-exited incarnation is counted once against
        ``max_failure``. Budget and auto-deactivation follow in ``_settle``.
        """
        info = g.ranks[rank]
        info.state = OFFLINE
        g.fence_epoch += 1
        info.last_heartbeat_ts = g.alive.pop(rank, info.last_heartbeat_ts)
        g.candidates.discard(rank)
        g.healthy.discard(rank)
        g.touched.add(rank)
        g.dirty = True
        if failure and not info.exited and not info.failure_counted:
            info.failure_counted = True
            g.failures += 1
            g.failed.append((rank, info.rank_epoch))
        g.budget_due = True
        change = g.change
        if change is not None and rank in change.waiting:
            change.waiting.discard(rank)
            (change.exited if info.exited else change.dropped).add(rank)
        self._rank_state(g, rank, reason, record, effects, cause=cause)
        for facet in self.facets:
            facet.rank_lost(self, g, rank, record, effects)

    def _expire_heartbeats(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        timeout = g.cfg.heartbeat_timeout_ns
        alive = g.alive
        while alive:
            rank, last = next(iter(alive.items()))
            if last + timeout > self._now:
                break
            self._go_offline(
                g,
                rank,
                f"heartbeat timeout: last sign of life at {last}, deadline {last + timeout}",
                True,
                record,
                effects,
            )

    # ------------------------------------------------------------------ evidence

    def _touch(self, g: GroupState, rank: int) -> None:
        """Any input from the current online incarnation is a sign of life."""
        g.alive[rank] = self._now
        g.alive.move_to_end(rank)

    def _set_evidence(self, g: GroupState, rank: int, down: frozenset[int], ready: bool) -> None:
        info = g.ranks[rank]
        if info.down == down and info.self_ready == ready:
            return
        info.down = down
        info.self_ready = ready
        if down:
            g.reporters.add(rank)
        else:
            g.reporters.discard(rank)
        if ready and info.state != OFFLINE:
            g.candidates.add(rank)
        else:
            g.candidates.discard(rank)
        g.touched.add(rank)
        g.dirty = True

    def _forget_evidence_about(self, g: GroupState, rank: int) -> None:
        """A replacement process is new: other ranks' down evidence about the old one lapses."""
        for reporter in sorted(g.reporters):
            info = g.ranks[reporter]
            if rank in info.down:
                info.down = info.down - {rank}
                if not info.down:
                    g.reporters.discard(reporter)
                g.dirty = True

    def _down_graph(self, g: GroupState) -> dict[int, set[int]]:
        cand = g.candidates
        down: dict[int, set[int]] = {}
        for rank in g.reporters:
            if rank not in cand:
                continue
            for peer in g.ranks[rank].down:
                if peer in cand:
                    down.setdefault(rank, set()).add(peer)
                    down.setdefault(peer, set()).add(rank)
        return down

    def _recompute_healthy_set(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """HEALTHY = inside the Healthy Set; a candidate outside it is SYNCED."""
        g.dirty = False
        down = self._down_graph(g)
        if not down and g.healthy_is_all:
            # Still no down edge: every candidate is in, and only touched ranks can have moved
            # (a group of thousands forming costs O(1) per ready report, not O(world_size)).
            left = {r for r in g.touched if r in g.healthy and r not in g.candidates}
            joined = {r for r in g.touched if r in g.candidates and r not in g.healthy}
            g.healthy -= left
            g.healthy |= joined
        else:
            new = g.candidates - excluded_ranks(down, g.healthy) if down else set(g.candidates)
            left = g.healthy - new
            joined = new - g.healthy
            g.healthy = new
        g.healthy_is_all = not down
        g.touched.clear()
        if not left and not joined:
            return
        size = len(g.healthy)
        for rank in sorted(left | joined):
            info = g.ranks[rank]
            if rank in joined:
                info.state = HEALTHY
                reason = f"in the Healthy Set ({size} ranks)"
            else:
                info.state = SYNCED
                peers = down.get(rank, ())
                why = f"links down to {ranks_text(peers)}" if peers else "not self-ready"
                reason = f"left the Healthy Set ({size} ranks): {why}"
            self._rank_state(g, rank, reason, record, effects)

    # ------------------------------------------------------------------ decisions

    def _settle(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """Make every decision the current facts allow, in a fixed order (see module doc)."""
        if g.dirty and g.window_end is None:
            self._recompute_healthy_set(g, record, effects)
        self._enforce_budget(g, record, effects)
        while True:
            change = g.change
            if change is not None:
                if not change.waiting:
                    self._commit(g, record, effects)
                    continue
                self._attach_heads(g, record, effects)
                return
            if g.formation == FAILED or g.shutdown is not None or g.window_end is not None:
                return
            if g.formation == FORMING:
                if len(g.healthy) < g.cfg.min_ranks:
                    return
                self._prepare(
                    g,
                    tuple(sorted(g.healthy)),
                    "formation",
                    [],
                    f"{len(g.healthy)}/{g.cfg.world_size} ranks HEALTHY "
                    f"(min_ranks {g.cfg.min_ranks})",
                    record,
                    effects,
                )
                continue
            if g.cfg.auto_deactivate and self._auto_deactivate(g, record, effects):
                continue
            if not self._decide_head(g, record, effects):
                return

    def _enforce_budget(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """One ``shutdown_with_save`` per group, ever: at ``max_failure`` failed incarnations, or
        when failures leave fewer live active ranks than the backend needs. Pending proposals
        are then rejected; a change already in flight may still commit."""
        if not g.budget_due:
            return
        g.budget_due = False
        if g.shutdown is not None or g.formation == FAILED:
            return
        cfg = g.cfg
        reason = detail = None
        if cfg.max_failure is not None and g.failures >= cfg.max_failure:
            reason = "max_failure_exceeded"
            failed = ", ".join(f"{r}@{e}" for r, e in g.failed[:16])
            if len(g.failed) > 16:
                failed += f", ... (+{len(g.failed) - 16} more)"
            detail = (
                f"{g.failures} failed incarnations (rank@rank_epoch [{failed}]) "
                f"reached max_failure {g.config.max_failure!r} = {cfg.max_failure}"
            )
        elif g.view is not None:
            active = g.view.active_ranks
            lost = [r for r in active if g.ranks[r].state == OFFLINE]
            if lost and any(not g.ranks[r].exited for r in lost):
                survivors = len(active) - len(lost)
                if survivors < cfg.survivor_floor:
                    reason = "all_ranks_lost" if survivors == 0 else "single_survivor"
                    detail = (
                        f"{survivors} of active ranks {ranks_text(active)} left (lost "
                        f"{ranks_text(lost)}); backend {g.config.backend} needs "
                        f"{cfg.survivor_floor}"
                    )
        if reason is None:
            return
        g.shutdown = reason
        effects.append(
            ShutdownWithSave(group=g.name, reason=reason, detail=detail or "", offset=record.offset)
        )
        while g.queue:
            pid, _ = g.queue.popleft()
            self._resolve(
                g, pid, REJECTED, None, f"group was shut down ({reason})", record, effects
            )

    def _auto_deactivate(self, g: GroupState, record: Record, effects: list[Effect]) -> bool:
        """Active ranks outside the Healthy Set are removed through the barrier; this takes
        precedence over queued proposals but never preempts the change in flight. It never
        empties the view: with no active rank left healthy, the group waits."""
        active = g.active
        leaving = [r for r in active if r not in g.healthy]
        if not leaving or len(leaving) == len(active):
            return False
        states = ", ".join(f"{r} {g.ranks[r].state}" for r in leaving[:16])
        more = f", ... (+{len(leaving) - 16} more)" if len(leaving) > 16 else ""
        self._prepare(
            g,
            tuple(r for r in active if r in g.healthy),
            "auto_deactivation",
            [],
            f"active ranks left the Healthy Set: {states}{more}",
            record,
            effects,
        )
        return True

    def _decide_head(self, g: GroupState, record: Record, effects: list[Effect]) -> bool:
        """Decide the proposal at the head of the queue; True if it was decided.

        Checked in order: ranks in range and distinct (else rejected); the resulting view equal
        to the current one (then ``applied`` at once with the current version: deduplication);
        for deactivate, at least ``min_active`` ranks left; for activate, every rank of the
        result HEALTHY and the result a clique of usable edges. A head that is not admissible
        yet waits until its admission deadline, then is rejected naming each rank and state.
        """
        if not g.queue:
            return False
        pid, deadline = g.queue[0]
        proposal = self._proposals[pid]
        invalid = static_problem(g, proposal)
        if invalid is not None:
            g.queue.popleft()
            self._resolve(g, pid, REJECTED, None, invalid, record, effects)
            return True
        active = g.active
        target = requested(proposal, active)
        if target == active:
            g.queue.popleft()
            self._resolve(
                g,
                pid,
                APPLIED,
                g.version,
                f"no change needed: version {g.version} already has active ranks {ranks_text(active)}",
                record,
                effects,
            )
            return True
        if proposal.op == "deactivate":
            if len(target) < g.cfg.min_active:
                g.queue.popleft()
                self._resolve(
                    g,
                    pid,
                    REJECTED,
                    None,
                    f"deactivating {ranks_text(proposal.ranks)} would leave {len(target)} active "
                    f"ranks {ranks_text(target)}; min_active is {g.cfg.min_active}",
                    record,
                    effects,
                )
                return True
        else:
            problem = admission_problem(g, target)
            if problem is not None:
                if self._now < deadline:
                    return False
                g.queue.popleft()
                self._resolve(
                    g,
                    pid,
                    REJECTED,
                    None,
                    f"not admissible by the admission deadline {deadline}: {problem}",
                    record,
                    effects,
                )
                return True
        g.queue.popleft()
        self._prepare(
            g,
            target,
            "proposal",
            [pid],
            f"proposal {pid}: {proposal.op} {ranks_text(proposal.ranks)}",
            record,
            effects,
        )
        return True

    def _attach_heads(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """While a change is in flight, heads it already satisfies ride along with it (and
        resolve with its version when it commits); malformed heads are rejected at once."""
        change = g.change
        assert change is not None
        while g.queue:
            pid, _ = g.queue[0]
            proposal = self._proposals[pid]
            invalid = static_problem(g, proposal)
            if invalid is not None:
                g.queue.popleft()
                self._resolve(g, pid, REJECTED, None, invalid, record, effects)
                continue
            if requested(proposal, change.active) != change.active:
                return
            g.queue.popleft()
            change.proposals.append(pid)

    def _expire_unformed_heads(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """Before formation nothing can be admitted, but admission deadlines still run."""
        while g.queue and g.queue[0][1] <= self._now:
            pid, deadline = g.queue.popleft()
            self._resolve(
                g,
                pid,
                REJECTED,
                None,
                f"group {g.name!r} had not formed by the admission deadline {deadline}",
                record,
                effects,
            )

    # ------------------------------------------------------------------ the barrier

    def _prepare(
        self,
        g: GroupState,
        target: tuple[int, ...],
        kind: str,
        proposals: list[int],
        detail: str,
        record: Record,
        effects: list[Effect],
    ) -> None:
        """Phase one: send ``view_prepare(version + 1)`` to the participants, the online ranks
        active in the old view or the new one."""
        members = set(g.active) | set(target)
        participants = tuple(r for r in sorted(members) if g.ranks[r].state != OFFLINE)
        change = Change(
            g.version + 1,
            target,
            participants,
            self._now + g.cfg.ack_timeout_ns,
            kind,
            proposals,
            detail,
        )
        g.change = change
        effects.append(
            ViewPrepare(
                group=g.name,
                version=change.version,
                active_ranks=target,
                participants=participants,
                ack_deadline_ts=change.ack_deadline,
                cause=change.cause(),
                offset=record.offset,
            )
        )
        self._attach_heads(g, record, effects)

    def _commit(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """Phase two: every participant ACKed, was dropped or exited. Dropped and exited ranks
        leave the view (only the dropped ones are reported as dropped); the proposals it
        carries resolve ``applied`` (or ``applied_with_dropped_ranks``).

        A view never commits with empty ``active_ranks``: if every rank of the new active set
        left first, see :meth:`_commit_without_target`."""
        change = g.change
        assert change is not None
        gone = change.dropped | change.exited
        active = tuple(r for r in change.active if r not in gone)
        if not active:
            self._commit_without_target(g, record, effects)
            return
        g.change = None
        dropped = tuple(sorted(change.dropped))
        exited = ranks_text(r for r in change.active if r in change.exited)
        view = self._commit_view(g, change, active, change.cause(), record, effects)
        status = APPLIED_WITH_DROPPED_RANKS if dropped else APPLIED
        for pid in change.proposals:
            reason = f"committed in version {view.version}"
            if dropped:
                reason += f"; dropped ranks {ranks_text(dropped)} (no ACK)"
            if exited != "[]":
                reason += f"; exited cleanly before it committed: {exited}"
            self._resolve(g, pid, status, view.version, reason, record, effects, dropped)
        self._enforce_budget(g, record, effects)

    def _commit_view(
        self,
        g: GroupState,
        change: Change,
        active: tuple[int, ...],
        cause: dict[str, Any],
        record: Record,
        effects: list[Effect],
    ) -> View:
        """Make ``change``'s version, with ``active`` ranks, the group's committed view."""
        base = g.view
        view = View(
            group=g.name,
            version=change.version,
            active_ranks=active,
            rank_states={r: info.state for r, info in enumerate(g.ranks)},
            healthy_set=tuple(sorted(g.healthy)),
            cause=cause,
            acked_ranks=tuple(sorted(change.acked)),
            dropped_ranks=tuple(sorted(change.dropped)),
            offset=record.offset,
            ts=self._now,
        )
        g.view = view
        g.budget_due = True
        if g.formation == FORMING:
            g.formation = FORMED
        effects.append(ViewCommitted(view=view, offset=record.offset, base=base))
        for facet in self.facets:
            facet.view_committed(self, g, view, base, record, effects)
        return view

    def _commit_without_target(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """Every rank of the change's new active set exited or was dropped before the commit.

        An empty view is never committed. If participants of the old view are still online
        (they ACKed, all of them: the commit waits for that), the version commits for them, so
        the ranks that are left keep a view to run on and no ACKed version is ever prepared
        again with other contents. If nobody is left (every worker exited or died), the change
        is withdrawn: the last committed view stays current, a record of the ranks that ran in
        it; rank states say who exited and who failed, and the budget has already judged the
        losses. Either way the change's proposals did not take effect and are rejected."""
        change = g.change
        assert change is not None
        g.change = None
        left = (
            f"every rank of version {change.version}'s active ranks {ranks_text(change.active)} "
            f"left before it committed (exited {ranks_text(change.exited)}, dropped "
            f"{ranks_text(change.dropped)})"
        )
        live = tuple(r for r in sorted(change.acked) if g.ranks[r].state != OFFLINE)
        if live:
            cause = change.cause()
            cause["detail"] += f"; {left}, so it keeps the live ranks {ranks_text(live)}"
            view = self._commit_view(g, change, live, cause, record, effects)
            outcome = f"{left}; version {view.version} keeps {ranks_text(live)}"
        else:
            outcome = f"{left}; version {g.version} stays current"
        for pid in change.proposals:
            self._resolve(g, pid, REJECTED, None, outcome, record, effects)
        self._enforce_budget(g, record, effects)

    def _fail_formation(
        self, g: GroupState, deadline: int, record: Record, effects: list[Effect]
    ) -> None:
        missing = tuple(r for r, info in enumerate(g.ranks) if info.state != HEALTHY)
        ready = g.cfg.world_size - len(missing)
        g.formation = FAILED
        g.fence_epoch += 1
        for rank, last in g.alive.items():
            g.ranks[rank].last_heartbeat_ts = last
        g.alive.clear()  # a failed group tracks no more deadlines; its inputs are refused
        g.window_end = None
        g.formation_error = (
            f"{ready}/{g.cfg.world_size} ranks HEALTHY by the formation deadline {deadline} "
            f"(min_ranks {g.cfg.min_ranks}); missing {ranks_text(missing)}"
        )
        effects.append(
            GroupFailed(
                group=g.name, reason=g.formation_error, missing_ranks=missing, offset=record.offset
            )
        )
        while g.queue:
            pid, _ = g.queue.popleft()
            self._resolve(
                g,
                pid,
                REJECTED,
                None,
                f"group failed to form: {g.formation_error}",
                record,
                effects,
            )

    def _resolve(
        self,
        g: GroupState,
        pid: int,
        status: str,
        version: int | None,
        reason: str,
        record: Record,
        effects: list[Effect],
        dropped: tuple[int, ...] = (),
    ) -> None:
        """Give a proposal its one terminal outcome; it never changes afterwards."""
        proposal = self._proposals[pid]
        assert proposal.status == PENDING, f"proposal {pid} is already {proposal.status}"
        resolved = msgspec.structs.replace(
            proposal,
            status=status,
            version=version,
            reason=reason,
            dropped_ranks=dropped,
            resolved_offset=record.offset,
        )
        self._proposals[pid] = resolved
        effects.append(ProposalResolved(proposal=resolved, offset=record.offset))

    def _rank_state(
        self,
        g: GroupState,
        rank: int,
        reason: str,
        record: Record,
        effects: list[Effect],
        *,
        cause: str | None = None,
    ) -> None:
        info = g.ranks[rank]
        effects.append(
            RankState(
                group=g.name,
                rank=rank,
                state=info.state,
                incarnation=info.incarnation,
                rank_epoch=info.rank_epoch,
                reason=reason,
                cause=cause,
                offset=record.offset,
            )
        )

    # ------------------------------------------------------------------ deadlines

    def _group_deadline(self, g: GroupState) -> int | None:
        best: int | None = None

        def consider(t: int) -> None:
            nonlocal best
            if best is None or t < best:
                best = t

        if g.alive:
            consider(next(iter(g.alive.values())) + g.cfg.heartbeat_timeout_ns)
        if g.window_end is not None:
            consider(g.window_end)
        if g.change is not None:
            consider(g.change.ack_deadline)
        if g.formation == FORMING:
            if g.change is None and g.shutdown is None:
                consider(g.created_ts + g.cfg.formation_timeout_ns)
            if g.queue:
                consider(g.queue[0][1])
        elif (
            g.formation == FORMED
            and g.queue
            and g.change is None
            and g.window_end is None
            and g.shutdown is None
        ):
            consider(g.queue[0][1])
        return best
