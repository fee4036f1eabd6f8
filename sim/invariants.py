"""The invariants the simulator checks after every step, each stated once.

:class:`Invariants` is fed the facts of a run as they happen: records appended to the log,
outcomes answered to a client, the effects of each record the first time a fold produced them,
the views agents installed, the fold's public status after a step. Each ``check_*`` method is
one invariant; its docstring states it. A broken invariant raises :class:`Violation` naming it.

The checks keep their own model of what the effects said (rank states, evidence, proposals), so
they do not trust the fold's internals: they compare what the fold *did* with what the facts it
was given allow. ``tests/sim/test_sim.py`` feeds each check a deliberately broken history to
show that it can fail. A facet's own invariants are its part of the simulator's
(``sim/world.py``, "Facets"; the epochs' in ``facets/epochs/sim.py``), raising the same
:class:`Violation`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from ..coordinator.fold.effects import (
    HEALTHY,
    OFFLINE,
    TERMINAL,
    Effect,
    GroupCreated,
    GroupFailed,
    ProposalAccepted,
    ProposalResolved,
    RankState,
    Refused,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from ..eventlog.record import Record
from ..wire import ranks as rank_sets
from ..wire.protocol import View, links_down

_encode = msgspec.json.Encoder().encode

#: The invariants by name, in the order they are stated below.
NAMES = (
    "log_gap_free_and_kept",
    "one_view_per_version",
    "agent_view_in_history",
    "members_acked_or_dropped",
    "activation_healthy_clique",
    "terminal_proposals_final",
    "one_change_in_flight",
    "shutdown_once",
    "clean_exit_not_failure",
    "replay_identical",
    "converged",
)


class Violation(AssertionError):
    """An invariant did not hold."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(f"{name}: {detail}")
        self.name = name
        self.detail = detail


def encode_effects(effects: Iterable[Effect]) -> bytes:
    """The canonical bytes of a step's effects (what "byte-identical" compares)."""
    return _encode(list(effects))


class _Group:
    """What the effects said about one group so far."""

    def __init__(self, world_size: int, max_failure: int | None) -> None:
        self.world_size = world_size
        self.max_failure = max_failure
        self.state = [OFFLINE] * world_size
        self.incarnation: list[str | None] = [None] * world_size
        self.epoch = [0] * world_size
        self.exited = [False] * world_size
        #: the down evidence of each rank's current incarnation (its latest links report)
        self.down: list[frozenset[int]] = [frozenset()] * world_size
        #: the version committed when each rank's current incarnation joined: a report about
        #: that view or an older one is not evidence about this incarnation
        self.joined = [0] * world_size
        self.counted: set[tuple[int, int]] = set()  # failed incarnations (rank, rank_epoch)
        self.views: dict[int, bytes] = {}
        self.last_version = 0
        self.last_active: set[int] = set()
        self.prepared: ViewPrepare | None = None  # the latest prepare
        self.acks: set[int] = set()  # ACKs accepted for the latest prepare
        self.exits: set[int] = set()  # exits accepted since the latest prepare
        self.shutdown: ShutdownWithSave | None = None
        self.failed = False


class Invariants:
    """The checks of one run; see the module docstring."""

    def __init__(self) -> None:
        self.length = 0
        self.last: Record | None = None
        self.groups: dict[str, _Group] = {}
        self.proposals: dict[int, Any] = {}  # id -> the proposal as last seen (a Proposal)
        self.terminal: dict[int, bytes] = {}
        self.ops: dict[int, str] = {}
        #: offset -> the encoded effects the first fold of that record produced
        self.effects: dict[int, bytes] = {}
        #: (rank, incarnation) -> the last version that agent installed
        self.installed: dict[tuple[int, str], int] = {}
        self.agent_shutdowns: dict[tuple[int, str], int] = {}

    # -- 1 -------------------------------------------------------------------------------------

    def check_log_gap_free_and_kept(
        self, log: Sequence[Record], answered: Iterable[tuple[int, str, str | None, Any, Any]]
    ) -> None:
        """Offsets are gap-free (record ``i`` of the log has offset ``i + 1``), the log only
        grows, and every record acknowledged to a client (``Appended(offset)``) is in the log
        at that offset with the kind, group, rank and payload the client sent (a shared
        heartbeat record names the rank whose beat it acknowledged)."""
        name = "log_gap_free_and_kept"
        if len(log) < self.length:
            raise Violation(name, f"the log shrank from {self.length} to {len(log)} records")
        if self.length and log[self.length - 1] is not self.last:
            raise Violation(name, f"the record at offset {self.length} was replaced")
        for i in range(self.length, len(log)):
            if log[i].offset != i + 1:
                raise Violation(name, f"record {i} of the log has offset {log[i].offset}")
        self.length = len(log)
        self.last = log[-1] if log else None
        for offset, kind, group, rank, payload in answered:
            if not 1 <= offset <= len(log):
                raise Violation(name, f"acknowledged offset {offset} is not in the log")
            rec = log[offset - 1]
            if kind == "heartbeat" and rec.rank is None and "ranks" in rec.payload:
                ws = self.groups[group].world_size if group in self.groups else 1 << 16
                ok = rec.kind == kind and rec.group == group
                ok = ok and rank in rank_sets.decode(rec.payload["ranks"], ws)
            else:
                ok = (rec.kind, rec.group, rec.rank, rec.payload) == (kind, group, rank, payload)
            if not ok:
                raise Violation(
                    name, f"acknowledged {kind} of rank {rank} at {offset}, the log holds {rec!r}"
                )

    # -- the effects of one record -------------------------------------------------------------

    def on_record(self, rec: Record, effects: Sequence[Effect]) -> None:
        """Feed the effects of ``rec`` (the first fold that stepped it); runs the checks that
        concern effects, in the order the effects came."""
        data = encode_effects(effects)
        seen = self.effects.get(rec.offset)
        if seen is not None:
            self.check_replay_identical(rec.offset, seen, data)
            return
        self.effects[rec.offset] = data
        refused = any(isinstance(e, Refused) and e.offset == rec.offset for e in effects)
        g = self.groups.get(rec.group) if rec.group is not None else None
        if g is not None and not refused and rec.rank is not None:
            self._fact(g, rec)
        for e in effects:
            if isinstance(e, RankState):
                self._rank_state(self.groups[e.group], e)
            elif isinstance(e, ViewPrepare):
                gp = self.groups[e.group]
                self.check_one_change_in_flight(gp, e)
                self.check_activation_healthy_clique(gp, e)
                gp.prepared, gp.acks, gp.exits = e, set(), set()
            elif isinstance(e, ViewCommitted):
                gp = self.groups[e.view.group]
                self.check_one_view_per_version(gp, e.view)
                self.check_members_acked_or_dropped(gp, e.view)
                gp.prepared = None
            elif isinstance(e, ProposalAccepted | ProposalResolved):
                self.check_terminal_proposals_final(e)
            elif isinstance(e, ShutdownWithSave):
                self.check_shutdown_once(self.groups[e.group], e)
            elif isinstance(e, GroupFailed):
                gp = self.groups[e.group]
                gp.failed, gp.prepared = True, None
            elif isinstance(e, GroupCreated) and e.group not in self.groups:
                cfg = e.config.resolve()
                self.groups[e.group] = _Group(cfg.world_size, cfg.max_failure)

    def _fact(self, g: _Group, rec: Record) -> None:
        """An accepted rank input: the evidence and the exits the checks rely on."""
        rank = rec.rank
        assert rank is not None
        kind = rec.kind
        if kind == "links":
            g.down = list(g.down)
            down = links_down(rec.payload, g.world_size) - {rank}
            about = rec.payload.get("version")
            if about is not None:
                down = frozenset(p for p in down if about > g.joined[p])
            g.down[rank] = down
        elif kind == "join":
            inc = rec.payload.get("incarnation")
            if inc != g.incarnation[rank]:
                # a new process: its evidence and every other rank's evidence about it lapse,
                # and so does any report about a view committed before it joined
                g.down = [d - {rank} for d in g.down]
                g.down[rank] = frozenset()
                g.joined[rank] = g.last_version
            elif g.state[rank] == OFFLINE:
                g.down = list(g.down)
                g.down[rank] = frozenset()
        elif kind == "exit":
            g.exited[rank] = True
            g.exits.add(rank)
        elif (
            kind == "ack"
            and g.prepared is not None
            and rec.payload.get("version") == g.prepared.version
        ):
            g.acks.add(rank)

    def _rank_state(self, g: _Group, e: RankState) -> None:
        rank = e.rank
        if e.incarnation != g.incarnation[rank]:
            g.incarnation[rank] = e.incarnation
        if e.state == OFFLINE and g.state[rank] != OFFLINE and e.reason != "exited cleanly":
            if not g.exited[rank]:
                g.counted.add((rank, e.rank_epoch))
        elif e.state != OFFLINE and g.state[rank] == OFFLINE:
            g.exited[rank] = False  # a join brought the rank back
        g.state[rank] = e.state
        g.epoch[rank] = e.rank_epoch

    # -- 2, 3 ----------------------------------------------------------------------------------

    def check_one_view_per_version(self, g: _Group, view: View) -> None:
        """One committed view per (group, version): each commit is the next version, and a
        version, once committed, is never committed again with other contents."""
        name = "one_view_per_version"
        data = _encode(view)
        seen = g.views.get(view.version)
        if seen is not None and seen != data:
            raise Violation(name, f"version {view.version} committed twice, differently")
        if seen is None and view.version != g.last_version + 1:
            raise Violation(
                name, f"committed version {view.version} after version {g.last_version}"
            )
        g.views[view.version] = data
        g.last_version = max(g.last_version, view.version)

    def check_agent_view_in_history(self, group: str, rank: int, inc: str, view: View) -> None:
        """Every agent's view is a prefix of the group's history: the view an agent installs
        is, byte for byte, the committed view of its version, and each agent only moves
        forward through the versions."""
        name = "agent_view_in_history"
        g = self.groups.get(group)
        committed = None if g is None else g.views.get(view.version)
        if committed is None:
            raise Violation(
                name, f"rank {rank} ({inc}) installed uncommitted version {view.version}"
            )
        if _encode(view) != committed:
            raise Violation(
                name, f"rank {rank} ({inc}) holds a version {view.version} unlike the committed one"
            )
        last = self.installed.get((rank, inc), 0)
        if view.version < last:
            raise Violation(
                name, f"rank {rank} ({inc}) went back from version {last} to {view.version}"
            )
        self.installed[(rank, inc)] = view.version

    # -- 4 -------------------------------------------------------------------------------------

    def check_members_acked_or_dropped(self, g: _Group, view: View) -> None:
        """A committed view's members ACKed it or were dropped and named: every participant of
        the prepare it commits ACKed (an ACK the log holds), exited cleanly, or is named in
        ``dropped_ranks``; and every active rank of it ACKed, except a rank that was already
        active and OFFLINE when the change was prepared (not a participant: with
        ``auto_deactivate_on_failure`` off it stays active until the upper layer removes it).
        No rank enters a view without ACKing it."""
        name = "members_acked_or_dropped"
        p = g.prepared
        if p is None or p.version != view.version:
            raise Violation(name, f"version {view.version} committed without its prepare")
        acked, dropped = set(view.acked_ranks), set(view.dropped_ranks)
        carried = (set(p.active_ranks) - set(p.participants)) & g.last_active
        if not set(view.active_ranks) <= acked | carried:
            raise Violation(
                name,
                f"version {view.version}: active {view.active_ranks} not all in acked "
                f"{view.acked_ranks} (absent and already active: {sorted(carried)})",
            )
        if not acked <= g.acks:
            raise Violation(
                name, f"version {view.version} names ACKs {sorted(acked - g.acks)} the log lacks"
            )
        if acked & dropped:
            raise Violation(
                name, f"version {view.version}: {sorted(acked & dropped)} acked and dropped"
            )
        unnamed = set(p.participants) - acked - dropped - g.exits
        if unnamed:
            raise Violation(
                name,
                f"version {view.version}: participants {sorted(unnamed)} neither ACKed, "
                "exited nor were named dropped",
            )
        g.last_active = set(view.active_ranks)

    # -- 5 -------------------------------------------------------------------------------------

    def check_activation_healthy_clique(self, g: _Group, p: ViewPrepare) -> None:
        """An activation (formation, an ``activate`` proposal, or a ``reconfigure``, which
        may add ranks) prepares only HEALTHY ranks forming a clique of usable edges: no rank of
        it has a current report of another rank of it being down."""
        kind = p.cause.get("kind")
        if kind == "proposal":
            ids = p.cause.get("proposals") or []
            if not ids or self.ops.get(ids[0]) != "activate":
                return
        elif kind not in ("formation", "reconfigure"):
            return
        name = "activation_healthy_clique"
        bad = [r for r in p.active_ranks if g.state[r] != HEALTHY]
        if bad:
            states = {r: g.state[r] for r in bad}
            raise Violation(name, f"version {p.version} ({kind}) activates non-HEALTHY {states}")
        members = set(p.active_ranks)
        for r in p.active_ranks:
            down = g.down[r] & members
            if down:
                raise Violation(
                    name, f"version {p.version} ({kind}): rank {r} reports {sorted(down)} down"
                )

    # -- 6 -------------------------------------------------------------------------------------

    def check_terminal_proposals_final(self, e: ProposalAccepted | ProposalResolved) -> None:
        """A proposal that reached a terminal status (applied, applied with dropped ranks,
        rejected) never changes again, and is never accepted anew."""
        name = "terminal_proposals_final"
        prop = e.proposal
        if prop.id in self.terminal:
            raise Violation(name, f"proposal {prop.id} changed after it was final: {prop!r}")
        self.ops.setdefault(prop.id, prop.op)
        self.proposals[prop.id] = prop
        if prop.status in TERMINAL:
            self.terminal[prop.id] = _encode(prop)

    def check_terminal_still(self, proposal_of: Any) -> None:
        """(part of ``terminal_proposals_final``) the fold still holds each final proposal as
        it was when it became final."""
        for pid, data in self.terminal.items():
            if _encode(proposal_of(pid)) != data:
                raise Violation("terminal_proposals_final", f"proposal {pid} changed in the fold")

    # -- 7 -------------------------------------------------------------------------------------

    def check_one_change_in_flight(self, g: _Group, p: ViewPrepare) -> None:
        """At most one change in flight per group: every prepare is of the version after the
        last committed one, so no two versions are ever being prepared at once, and a commit
        is always of the change prepared last (checked with the commit)."""
        if p.version != g.last_version + 1:
            raise Violation(
                "one_change_in_flight",
                f"prepared version {p.version} while version {g.last_version} is the last committed",
            )

    def check_status(self, group: str, status: dict[str, Any]) -> None:
        """After a step, the fold's own account agrees: the change it holds in flight (if any)
        is of the next version, and the failures it counted are those the effects show
        (``clean_exit_not_failure``)."""
        g = self.groups[group]
        change = status["change_in_flight"]
        if change is not None and change["version"] != g.last_version + 1:
            raise Violation(
                "one_change_in_flight",
                f"the fold holds version {change['version']} in flight after {g.last_version}",
            )
        self.check_clean_exit_not_failure(g, status["failures"])
        self.check_budget_enforced(g, status)

    # -- 8 -------------------------------------------------------------------------------------

    def check_shutdown_once(self, g: _Group, e: ShutdownWithSave) -> None:
        """The failure budget's ``shutdown_with_save`` is emitted at most once per group, and
        for ``max_failure_exceeded`` only once that many incarnations failed; once the budget
        is spent it has been emitted (``check_budget_enforced``)."""
        name = "shutdown_once"
        if g.shutdown is not None:
            raise Violation(name, f"a second shutdown: {e!r} after {g.shutdown!r}")
        if e.reason == "max_failure_exceeded" and (
            g.max_failure is None or len(g.counted) < g.max_failure
        ):
            raise Violation(
                name, f"max_failure_exceeded after {len(g.counted)} failures (max {g.max_failure})"
            )
        g.shutdown = e

    def check_budget_enforced(self, g: _Group, status: dict[str, Any]) -> None:
        """(part of ``shutdown_once``) a group whose failures reached ``max_failure`` has been
        told to shut down."""
        if (
            g.max_failure is not None
            and len(g.counted) >= g.max_failure
            and not g.failed
            and g.shutdown is None
        ):
            raise Violation(
                "shutdown_once",
                f"{len(g.counted)} failures reached max_failure {g.max_failure}, no shutdown",
            )

    def check_agent_shutdown(self, rank: int, inc: str) -> None:
        """(part of ``shutdown_once``) an agent acts on the shutdown directive once."""
        key = (rank, inc)
        self.agent_shutdowns[key] = self.agent_shutdowns.get(key, 0) + 1
        if self.agent_shutdowns[key] > 1:
            raise Violation("shutdown_once", f"rank {rank} ({inc}) was told to shut down twice")

    # -- 9 -------------------------------------------------------------------------------------

    def check_clean_exit_not_failure(self, g: _Group, failures: int) -> None:
        """A clean exit is never counted as a failure: the fold counts exactly the
        incarnations that went OFFLINE for a reason other than a clean exit (each once), and no
        incarnation that exited is among them."""
        name = "clean_exit_not_failure"
        if failures != len(g.counted):
            raise Violation(
                name, f"the fold counts {failures} failures, the effects show {len(g.counted)}"
            )

    # -- 10 ------------------------------------------------------------------------------------

    def check_replay_identical(self, offset: int, first: bytes, again: bytes) -> None:
        """Replaying the log gives byte-identical effects: whenever a record is folded again
        (by a coordinator restored from a snapshot and the log's tail, or by a fresh fold of the
        whole log at the end of the run) its effects equal, byte for byte, those of the first
        fold."""
        if first != again:
            raise Violation(
                "replay_identical",
                f"offset {offset}: first fold {first[:300]!r}, again {again[:300]!r}",
            )

    def check_projections(self, written: dict[Any, Any], derived: dict[Any, Any]) -> None:
        """(part of ``replay_identical``) the projection rows the run wrote equal those a
        fresh fold of the whole log derives."""
        if written != derived:
            keys = (
                sorted(set(written) ^ set(derived), key=str)[:5]
                or [k for k in derived if written.get(k) != derived[k]][:5]
            )
            raise Violation("replay_identical", f"projections differ at {keys}")

    # -- 11 ------------------------------------------------------------------------------------

    def check_converged(self, version: int, held: Iterable[tuple[int, str, int | None]]) -> None:
        """Liveness: once the faults stop and the group has settled, every running agent holds
        the group's current view, ``version`` (no agent is stranded on an older one)."""
        behind = [(rank, inc, v) for rank, inc, v in held if v != version]
        if behind:
            raise Violation(
                "converged",
                f"current version {version}; agents (rank, incarnation, version) {behind}",
            )
