"""Rank lifecycle and link evidence: what the fold records about each rank, and the one way a
rank is lost.

The rule. A rank is OFFLINE, SYNCED (talking to the coordinator, data plane not verified) or
HEALTHY (SYNCED and inside the Healthy Set, ``healthy_set.py``).

- A ``join`` makes an OFFLINE rank, or a new incarnation, SYNCED and not yet self-ready. A new
  incarnation bumps ``rank_epoch``, replaces the old one through the death chain if it was still
  online, and forgets every rank's down evidence about the old process: the replacement is a
  new process. The same incarnation joining while online is only a sign of life.
- Every input from the current online incarnation is a sign of life (it moves the rank to the
  back of the liveness order; the oldest beat times out first).
- A ``links`` report replaces the rank's previous evidence: the peers it finds down and whether
  it is self-ready. Worse evidence opens the reconciliation window, so reports from several
  ranks are decided together; a report about an older view than the one a peer joined in says
  nothing about that peer's replacement.
- Every way a rank is lost (heartbeat timeout, death report, a missed ACK, replacement, and a
  clean exit) ends in :meth:`Ranks.go_offline`, the death chain: OFFLINE, out of the
  Healthy Set, no longer awaited by the change in flight, and a failure counted once per
  incarnation (never for a clean exit). The budget (``budget.py``) judges it in the same step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from msgspec import UNSET

from ...eventlog.record import Record
from ...wire import ranks as rank_sets
from ...wire.inputs import (
    AckInput,
    DeathReportedInput,
    ExitInput,
    JoinInput,
    LinksInput,
    decode,
)
from ...wire.protocol import CAUSE_DEATH_REPORTED
from .effects import (
    OFFLINE,
    SYNCED,
    Effect,
    RankState,
)
from .facets import Facet, FoldContext
from .fencing import Fences
from .state import GroupState


class DeathChain(Protocol):
    """What a rule that takes ranks offline calls back (``Ranks.go_offline``)."""

    def go_offline(
        self,
        g: GroupState,
        rank: int,
        reason: str,
        failure: bool,
        record: Record,
        effects: list[Effect],
        *,
        cause: str | None = None,
    ) -> None: ...


class Ranks:
    """Every group's ranks (see the module docstring).

    It reads the group a record names (handed to each handler), the fold's time
    (``fold.now``) and, for a beat it does not take at once, the fences (``fences``); it
    tells the facets (``facets``, given ``fold``) of each rank lost or joined, and a links
    report of a view that failed with nobody blamed goes to the barrier's ``note_stall``.
    Its decisions are the ranks' states and their ``rank_state`` effects."""

    def __init__(
        self,
        fold: FoldContext,
        facets: tuple[Facet, ...],
        fences: Fences,
        note_stall: Callable[[GroupState, int, LinksInput, int], None],
    ) -> None:
        self._fold = fold
        self._facets = facets
        self._fences = fences
        self._note_stall = note_stall

    def on_join(
        self, g: GroupState, record: Record, join: JoinInput, effects: list[Effect]
    ) -> None:
        """An OFFLINE rank, or a new incarnation, becomes SYNCED (not yet self-ready).

        A new incarnation bumps ``rank_epoch``, replaces the old one through the death chain if
        it was still online, and clears its own link evidence *and* every other rank's down
        evidence about it: the replacement is a new process, and the facets hear of it (the
        epochs send it the rank's part). The same incarnation joining again while online is
        only a sign of life.
        """
        rank = record.rank
        assert rank is not None
        info = g.ranks[rank]
        inc = join.incarnation
        if join.host is not UNSET:
            info.host = join.host
        if join.pid is not UNSET:
            info.pid = join.pid
        new = inc != info.incarnation
        if not new:
            if info.state != OFFLINE:
                self._touch(g, rank)
                return
            reason = f"rejoined as the same incarnation {inc} (rank_epoch {info.rank_epoch})"
        else:
            if info.state != OFFLINE:
                self.go_offline(
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
        effects.append(rank_state(g, rank, reason, record))
        if new:
            for facet in self._facets:
                facet.rank_joined(self._fold, g, rank, record, effects)

    def on_heartbeat(self, g: GroupState | None, record: Record, now: int) -> list[Effect]:
        """A beat: a sign of life of the rank's current incarnation (beats that arrived
        together share one record: :meth:`_on_shared_heartbeat`). It only moves ranks to the
        back of the liveness order, so it never reaches ``_settle``.

        Fast path: a beat from the current incarnation of an online rank (exactly the ranks in
        ``alive``) is decided by one look-up of its incarnation, without decoding the rest
        (most records are beats). Anything else takes the checked path and is refused with a
        reason."""
        if g is not None:
            rank = record.rank
            if rank is None and "ranks" in record.payload:
                return self._on_shared_heartbeat(g, record, now)
            alive = g.alive
            if rank in alive and g.ranks[rank].incarnation == record.payload.get("incarnation"):
                alive.move_to_end(rank)  # type: ignore[arg-type]
                alive[rank] = now  # type: ignore[index]
                return []
        refusal = self._fences.refusal("heartbeat", record.group, record.rank, record.payload)
        return [self._fences.refused(record, refusal)] if refusal else []

    def _on_shared_heartbeat(self, g: GroupState, record: Record, now: int) -> list[Effect]:
        """The beats of many ranks that arrived together, in one record: each listed rank that
        is online is alive as of the record's time. The host checked every beat against this
        very state before appending (a stale incarnation never gets into the record); a rank
        that is not online here (a malformed or hand-written record) is passed over."""
        refusal, beat = self._fences.admit("heartbeat", record.group, None, record.payload)
        if refusal is not None:
            return [self._fences.refused(record, refusal)]
        if beat is None:
            beat = decode("heartbeat", record.payload)
        alive = g.alive
        for rank in rank_sets.decode(beat.ranks, g.cfg.world_size):  # type: ignore[attr-defined]
            if rank in alive:
                alive.move_to_end(rank)
                alive[rank] = now
        return []

    def on_links(
        self, g: GroupState, record: Record, links: LinksInput, effects: list[Effect]
    ) -> None:
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
        rank = record.rank
        assert rank is not None
        down = links.down_ranks(g.cfg.world_size)
        about = links.version
        if about is not None and not links.legacy:
            down = {p for p in down if about > g.ranks[p].joined_version}
        down.discard(rank)
        self._touch(g, rank)
        if not down and links.failed is not None:
            self._note_stall(g, rank, links, self._fold.now)
        info = g.ranks[rank]
        new_down = frozenset(down)
        ready = links.self_ready
        if new_down == info.down and ready == info.self_ready:
            return
        worse = bool(new_down - info.down) or (info.self_ready and not ready)
        self._set_evidence(g, rank, new_down, ready)
        if worse and g.window_end is None and g.cfg.reconcile_window_ns > 0:
            g.window_end = self._fold.now + g.cfg.reconcile_window_ns

    def on_ack(self, g: GroupState, record: Record, ack: AckInput, effects: list[Effect]) -> None:
        """A participant ACKs the version being prepared (a repeated ACK changes nothing)."""
        assert g.change is not None and record.rank is not None
        g.change.acked.add(record.rank)
        g.change.waiting.discard(record.rank)
        self._touch(g, record.rank)

    def on_exit(
        self, g: GroupState, record: Record, exit: ExitInput, effects: list[Effect]
    ) -> None:
        """A clean exit: OFFLINE and marked exited; it never counts against ``max_failure``."""
        rank = record.rank
        assert rank is not None
        info = g.ranks[rank]
        if info.state == OFFLINE:
            info.exited = True
            return
        info.exited = True
        self.go_offline(g, rank, "exited cleanly", False, record, effects)

    def on_death_reported(
        self, g: GroupState, record: Record, death: DeathReportedInput, effects: list[Effect]
    ) -> None:
        """A supervisor's death report takes the same death chain as a heartbeat timeout."""
        rank = record.rank
        assert rank is not None
        if g.ranks[rank].state == OFFLINE:
            return
        reporter = death.reporter
        by = f" by {reporter}" if reporter else ""
        self.go_offline(
            g, rank, f"death reported{by}", True, record, effects, cause=CAUSE_DEATH_REPORTED
        )

    def go_offline(
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
        effects.append(rank_state(g, rank, reason, record, cause=cause))
        for facet in self._facets:
            facet.rank_lost(self._fold, g, rank, record, effects)

    def expire_heartbeats(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        timeout = g.cfg.heartbeat_timeout_ns
        alive = g.alive
        while alive:
            rank, last = next(iter(alive.items()))
            if last + timeout > self._fold.now:
                break
            self.go_offline(
                g,
                rank,
                f"heartbeat timeout: last sign of life at {last}, deadline {last + timeout}",
                True,
                record,
                effects,
            )

    def _touch(self, g: GroupState, rank: int) -> None:
        """Any input from the current online incarnation is a sign of life."""
        g.alive[rank] = self._fold.now
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


def rank_state(
    g: GroupState,
    rank: int,
    reason: str,
    record: Record,
    *,
    cause: str | None = None,
    state: str | None = None,
) -> RankState:
    """The ``rank_state`` effect that tells of ``rank``'s state in ``g`` now (or ``state``, the
    one a decision moves it to), and why."""
    info = g.ranks[rank]
    return RankState(
        group=g.name,
        rank=rank,
        state=info.state if state is None else state,
        incarnation=info.incarnation,
        rank_epoch=info.rank_epoch,
        reason=reason,
        cause=cause,
        offset=record.offset,
    )
