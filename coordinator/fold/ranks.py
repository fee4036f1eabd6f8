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

Its interface: each handler (``on_join``, ``on_links``, ``on_ack``, ``on_exit``,
``on_death_reported``) reads the group, the record, its input and the fold's time, and returns
its decisions in order, values declared here (``Identified``, ``Lost``, ``Joined``,
``SignOfLife``, ``Evidence``, ``Acked``, ``Exited``; ``stalls.StallReport``), and
:func:`expired` the ranks a tick finds silent; it changes nothing. The machine applies them
(``apply.py``, where the death chain is ``Applier.go_offline``). A heartbeat is the exception,
for speed: :class:`Ranks` takes a current rank's beat in place (most records are beats), with
no decision value and no ``_settle``.
"""

from __future__ import annotations

from typing import Any

import msgspec
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
from .effects import OFFLINE, Effect
from .fencing import Fences
from .stalls import RETRY, StallReport
from .state import FORMED, GroupState


class SignOfLife(msgspec.Struct, frozen=True, gc=False):
    """An input from the rank's current online incarnation: it moves to the back of the
    liveness order, alive as of now."""

    rank: int


class Identified(msgspec.Struct, frozen=True, gc=False):
    """A join says where the rank runs (``host``, ``pid``; UNSET: not said)."""

    rank: int
    host: Any
    pid: Any


class Lost(msgspec.Struct, frozen=True, gc=False):
    """The death chain (``Applier.go_offline``), and why; ``failure``: counted against
    ``max_failure`` (never a clean exit); ``cause``: the ``rank_state``'s."""

    rank: int
    reason: str
    failure: bool
    cause: str | None = None


class Joined(msgspec.Struct, frozen=True, gc=False):
    """The rank is SYNCED as ``incarnation``: a new one (``new``: a new ``rank_epoch``, its
    evidence and every peer's down evidence about it forgotten, the facets told) or the same
    one back from OFFLINE."""

    rank: int
    incarnation: str
    new: bool
    reason: str


class Evidence(msgspec.Struct, frozen=True, gc=False):
    """The rank's latest link evidence, a sign of life too: the peers it finds ``down`` and
    whether it is ``ready``; ``window_end``: the reconciliation window it opens (None: none)."""

    rank: int
    down: frozenset[int]
    ready: bool
    window_end: int | None


class Acked(msgspec.Struct, frozen=True, gc=False):
    """The rank ACKed the version being prepared."""

    rank: int


class Exited(msgspec.Struct, frozen=True, gc=False):
    """The rank exited cleanly (marked before the death chain, so it is no failure)."""

    rank: int


def on_join(g: GroupState, record: Record, join: JoinInput, now: int) -> list[Any]:
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
    decisions: list[Any] = []
    if join.host is not UNSET or join.pid is not UNSET:
        decisions.append(Identified(rank, join.host, join.pid))
    if inc == info.incarnation:
        if info.state != OFFLINE:
            decisions.append(SignOfLife(rank))
            return decisions
        reason = f"rejoined as the same incarnation {inc} (rank_epoch {info.rank_epoch})"
        decisions.append(Joined(rank, inc, False, reason))
        return decisions
    if info.state != OFFLINE:
        decisions.append(Lost(rank, f"incarnation {info.incarnation} replaced by {inc}", True))
    reason = f"joined as incarnation {inc} (rank_epoch {info.rank_epoch + 1})"
    decisions.append(Joined(rank, inc, True, reason))
    return decisions


def on_links(g: GroupState, record: Record, links: LinksInput, now: int) -> list[Any]:
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
    after the join from bringing it back. A report that the view failed with nobody blamed
    goes to the group's stall (:func:`stall_report`).
    """
    rank = record.rank
    assert rank is not None
    down = links.down_ranks(g.cfg.world_size)
    about = links.version
    if about is not None and not links.legacy:
        down = {p for p in down if about > g.ranks[p].joined_version}
    down.discard(rank)
    decisions: list[Any] = []
    if not down and links.failed is not None:
        report = stall_report(g, rank, links)
        if report is not None:
            decisions.append(report)
    info = g.ranks[rank]
    new_down = frozenset(down)
    ready = links.self_ready
    if new_down == info.down and ready == info.self_ready:
        decisions.append(SignOfLife(rank))
        return decisions
    worse = bool(new_down - info.down) or (info.self_ready and not ready)
    window = g.cfg.reconcile_window_ns
    opens = worse and g.window_end is None and window > 0
    decisions.append(Evidence(rank, new_down, ready, now + window if opens else None))
    return decisions


def stall_report(g: GroupState, rank: int, links: LinksInput) -> StallReport | None:
    """A member says the committed view failed here blaming nobody (``fold/stalls.py``).
    Only a report about the current view of a formed group, from an active rank, counts."""
    version = links.failed
    if (
        g.formation != FORMED
        or g.shutdown is not None
        or g.view is None
        or version != g.view.version
        or not g.view.is_active(rank)
    ):
        return None
    retry = g.view.cause.get("kind") == RETRY
    return StallReport(rank, version, retry, links.issued or 0, links.completed or 0)


def on_ack(g: GroupState, record: Record, ack: AckInput, now: int) -> tuple[Acked]:
    """A participant ACKs the version being prepared (a repeated ACK changes nothing)."""
    assert g.change is not None and record.rank is not None
    return (Acked(record.rank),)


def on_exit(g: GroupState, record: Record, exit: ExitInput, now: int) -> tuple[Any, ...]:
    """A clean exit: OFFLINE and marked exited; it never counts against ``max_failure``."""
    rank = record.rank
    assert rank is not None
    if g.ranks[rank].state == OFFLINE:
        return (Exited(rank),)
    return Exited(rank), Lost(rank, "exited cleanly", False)


def on_death_reported(
    g: GroupState, record: Record, death: DeathReportedInput, now: int
) -> tuple[Lost, ...]:
    """A supervisor's death report takes the same death chain as a heartbeat timeout."""
    rank = record.rank
    assert rank is not None
    if g.ranks[rank].state == OFFLINE:
        return ()
    by = f" by {death.reporter}" if death.reporter else ""
    return (Lost(rank, f"death reported{by}", True, CAUSE_DEATH_REPORTED),)


def expired(g: GroupState, now: int) -> list[Lost]:
    """The online ranks whose last sign of life is a heartbeat timeout old, oldest first."""
    timeout = g.cfg.heartbeat_timeout_ns
    lost = []
    for rank, last in g.alive.items():
        if last + timeout > now:
            break
        reason = f"heartbeat timeout: last sign of life at {last}, deadline {last + timeout}"
        lost.append(Lost(rank, reason, True))
    return lost


class Ranks:
    """Every group's heartbeats: the one input taken in place (see the module docstring).

    It reads the group a beat names and, for a beat it does not take at once, the fences
    (``fences``)."""

    def __init__(self, fences: Fences) -> None:
        self._fences = fences

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
