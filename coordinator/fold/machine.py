"""The Coordinator: a pure, deterministic fold over the log, and the dispatcher of its rules.

``Coordinator.step(record) -> effects`` mutates the machine in place (h11-style) and returns
what the host must carry out. It does no I/O and reads no clock: time is the record's ``ts``
(clamped so it never runs backwards), and the host appends a ``tick`` once ``next_deadline()``
has passed. Iteration is always in a fixed order, so replaying a log gives byte-identical
effects, and ``snapshot()`` + the tail gives exactly what a full replay gives.

A step has two halves:

* the rule of its input (``TRANSITIONS``: the record's payload decoded into its Struct, one
  per kind in ``wire/inputs.py``) decides what the fact changes (a rank joined, reported
  links, ACKed, exited, died; a proposal arrived; the run ended), and ``apply.Applier``
  applies its decisions in order, running the *death chain* (``go_offline``) for a rank lost;
* :meth:`Coordinator._settle` then makes every decision that the new facts allow, in one fixed
  order: recompute the Healthy Set (unless a reconciliation window is open), enforce the failure
  budget, commit the change in flight once its barrier is complete, and otherwise start the next
  change: formation, then auto-deactivation, then the head of the proposal queue.

Heartbeats take a fast path that changes only liveness, so they never reach ``_settle``.

Each rule lives in a file of its own, whose docstring states it. The Coordinator owns the
state (groups, proposals, time, facets) and composes the rules; none of them inherits from
another or reaches the rest through a shared ``self``. A rule with a declared interface (the
ranks, the Healthy Set, the budget, the end of a run, the queue, a view change's prepare,
commit and stall) reads what it is handed and returns its decisions as small values that
``apply.py`` applies; the others are objects built here with what they read and the few rules
they call back, and apply what those decide (a tick: ``deadlines.py``) through ``apply.py``:

==================  =======================================================================
``fencing.py``      ``Fences``: which inputs are refused, before the append and in the step
``ranks.py``        ``on_join(g, record, join, now) -> [Lost, Joined, ...]``, and the others
``healthy_set.py``  ``healthy_moves(g, record) -> HealthyMoves``: who is HEALTHY
``budget.py``       ``budget_shutdown(g) -> Shutdown | None``: when a group shuts down for good
``apply.py``        ``Applier``: applies those decisions; the death chain (``go_offline``)
``proposals.py``    ``ProposalQueue.decide_head``, ``auto_deactivate``: the next change
``barrier.py``      ``prepare``, ``form``, ``resolve_stall``; ``ViewChange.commit``
``deadlines.py``    ``Deadlines``: the deadlines a tick fires, what a resumed tick restarts
``ending.py``       ``on_group_ended``, ``finish_if_done``: a run over, ended or finished
``outcomes.py``     ``resolve``: a proposal's one outcome, whichever rule decides it
==================  =======================================================================

``stalls.py`` decides a view that failed with nobody blamed; ``barrier.py`` carries it out.

State beside membership lives in *facets* (``coordinator/fold/facets.py``), each a package
the registry (``registry.py``) names: epoch plans and weight refits are two. A record of a
facet's kind is checked and stepped by the facet; every facet hears of each committed view,
each rank lost and each tick at fixed points of a step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from ...eventlog.record import Record
from ...wire import inputs
from ...wire.inputs import Input, decode
from . import ending, ranks
from .admission import admission_problem
from .apply import Applier, enforce_budget, move_healthy
from .barrier import ViewChange, form, resolve_stall
from .capture import FoldChanges, GroupCapture, Proposals
from .config import GroupConfig
from .deadlines import Deadlines
from .effects import Effect, GroupCreated, Proposal, Refused, View
from .facets import Facet
from .fencing import REPEATABLE, Fences, beats_not_current, current_beat, parse_group_created
from .healthy_set import healthy_moves
from .proposals import ProposalQueue, attach_heads, auto_deactivate
from .ranks import Ranks
from .reconfigure import uuid_proposal
from .registry import Facets, default_facets
from .state import FAILED, FORMING, GroupState
from .status import group_status

#: Format 2 adds the facets' state, format 3 each rank's ``joined_version``; a snapshot of an
#: older format still restores (without facets; every links report counting, as it then did).
SNAPSHOT_FORMAT = 3
_READABLE_FORMATS = (1, 2, 3)

#: The transition table: each input (``wire/inputs.py``), its rule and handler, and what it
#: moves. A handler takes ``(g, record, input, now)``, ``g`` the group the record names (None
#: only for a new group), and returns its decisions, which ``Applier.apply`` applies in order
#: (none changes the group or the proposals itself; the machine creates a group). A
#: heartbeat (``Ranks.on_heartbeat``) takes its own path, without ``_settle``; a tick
#: (``Deadlines.on_tick``) settles each group due.
TRANSITIONS: dict[type[Input], str] = {
    inputs.GroupCreatedInput: "machine._on_group_created",  # a new group: FORMING
    inputs.GroupEndedInput: "ending.on_group_ended",  # the group: ended, its changes rejected
    inputs.JoinInput: "ranks.on_join",  # the rank: OFFLINE or another incarnation -> SYNCED
    inputs.LinksInput: "ranks.on_links",  # the rank's evidence (worse: the window opens)
    inputs.AckInput: "ranks.on_ack",  # the change in flight: the rank ACKed
    inputs.ExitInput: "ranks.on_exit",  # the rank: -> OFFLINE, exited (no failure)
    inputs.DeathReportedInput: "ranks.on_death_reported",  # the rank: -> OFFLINE, a failure
    inputs.ProposalInput: "queue.on_proposal",  # the queue: a proposal (or a call joins one)
}


class Coordinator:
    """The fold. See the module docstring for the shape of a step. It owns the state (groups,
    proposals, time, facets) and composes the rule objects, each handed what it reads."""

    def __init__(self, facets: Facets | None = None) -> None:
        #: its ``registry.Facets``: what it folds besides membership (the command line's if None)
        self.composition = facets or default_facets()
        self._offset = 0
        self._now = 0
        self._groups: dict[str, GroupState] = {}
        self.changes = FoldChanges()  # what its steps changed: the read model takes them
        self._proposals = Proposals(self.changes)
        #: the facets (``registry.py``), in the fixed order their hooks run
        self.facets: tuple[Facet, ...] = tuple(p.fold() for p in self.composition.plugins)
        self._facet_named: dict[str, Facet] = {f.name: f for f in self.facets}
        self._facet_of: dict[str, Facet] = {k: f for f in self.facets for k in f.kinds}
        #: the kinds :meth:`repeat_of` may find an earlier input for
        self.repeatable: frozenset[str] = REPEATABLE.union(*(f.repeatable for f in self.facets))
        # The rules, each given what it reads (``self`` as a FoldContext: the time, and what
        # the facets' hooks are handed) and the few rules it calls back.
        groups, proposals, facets = self._groups, self._proposals, self.facets
        self._fences = Fences(self, groups, proposals, self._facet_of, self.composition.all_kinds)
        self._ranks = Ranks(self._fences)
        self._apply = Applier(self, facets, proposals).apply  # a bound method: one call less
        self._views = ViewChange(self)
        self._queue = ProposalQueue(self, proposals, admission_problem)
        self._deadlines = Deadlines(
            self, groups, proposals, facets, self._apply, self._settle, self.changes
        )
        rules = {"machine": self, "ranks": ranks, "ending": ending, "queue": self._queue}
        self._transitions: dict[type[Input], Callable[[Any, Record, Any, int], Any]] = {
            cls: getattr(rules[rule], name)
            for cls, (rule, name) in ((c, r.split(".")) for c, r in TRANSITIONS.items())
        }

    # ------------------------------------------------------------------ what facets read

    @property
    def now(self) -> int:
        """The fold's time (ns): the largest record ``ts`` seen."""
        return self._now

    @property
    def group_states(self) -> dict[str, GroupState]:
        """Every group's internal state (facets read it; nothing outside the fold should)."""
        return self._groups

    def facet(self, name: str) -> Any:
        """The facet named ``name`` (``registry.py``); KeyError if none is registered."""
        return self._facet_named[name]

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
            self.changes.beaten.add(record.group)  # type: ignore[arg-type]
            return self._ranks.on_heartbeat(self._groups.get(record.group), record, now)  # type: ignore[arg-type]
        if kind == "tick":
            return self._deadlines.on_tick(record, decode(kind, record.payload))  # type: ignore[arg-type]
        refusal, inp = self._fences.admit(kind, record.group, record.rank, record.payload)
        if refusal is not None:
            return [self._fences.refused(record, refusal)]
        effects: list[Effect] = []
        facet = self._facet_of.get(kind)
        if facet is not None:
            facet.apply(self, record, effects)
            return effects
        if inp is None:  # accepted by a fast check, not decoded
            inp = decode(kind, record.payload)
        group = record.group
        self.changes.groups.add(group)  # type: ignore[arg-type]
        g = self._groups.get(group)  # type: ignore[arg-type]
        self._apply(g, self._transitions[type(inp)](g, record, inp, now), record, effects)
        if (g := self._groups.get(group)) is not None:  # type: ignore[arg-type]
            self._settle(g, record, effects)
            if finished := ending.finish_if_done(g, record):  # after a clean exit
                self._apply(g, finished, record, effects)
        return effects

    def _settle(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """Make every decision the current facts allow, in a fixed order (see module doc)."""
        if g.dirty and g.window_end is None:
            move_healthy(g, healthy_moves(g, record), effects)
        if g.budget_due:  # a rank lost or a view committed since the budget was judged
            enforce_budget(g, self._proposals, record, effects)
        while True:
            change = g.change
            if change is not None:
                if not change.waiting:
                    self._apply(g, self._views.commit(g, record), record, effects)
                    if g.budget_due:
                        enforce_budget(g, self._proposals, record, effects)
                    continue
                if g.queue:
                    self._apply(g, attach_heads(g, self._proposals), record, effects)
                return
            if g.formation == FAILED or g.shutdown is not None or g.window_end is not None:
                return
            if g.formation == FORMING:
                if (formation := form(g, self._now)) is None:
                    return
                self._apply(g, (formation,), record, effects)
                continue
            if g.cfg.auto_deactivate and (removal := auto_deactivate(g, self._now)):
                self._apply(g, (removal,), record, effects)
                continue
            if g.stall is not None:  # a change prepared or a shutdown: the loop's next turn
                self._apply(g, resolve_stall(g, record, self._now), record, effects)
                if g.change is not None or g.shutdown is not None:
                    continue
            if not (head := self._queue.decide_head(g)):
                return
            self._apply(g, head, record, effects)

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
    def from_snapshot(cls, data: dict[str, Any], facets: Facets | None = None) -> Coordinator:
        """Restore a machine of ``facets`` from :meth:`snapshot` (after a JSON round trip too)."""
        if data.get("format") not in _READABLE_FORMATS:
            raise ValueError(
                f"snapshot format {data.get('format')!r} is not one of {_READABLE_FORMATS}; "
                "rebuild the fold by replaying the log"
            )
        m = cls(facets)
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

    def group_deleted(self, group: str) -> bool:
        """Whether ``group`` was ended and deleted (gone from listings and the server's limits;
        its history stays readable)."""
        g = self._groups.get(group)
        return g is not None and g.deleted

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
        return None if g is None else group_status(GroupCapture(g))

    def proposal_by_uuid(self, group: str, uuid: int) -> Proposal | None:
        """The reconfigure proposal of ``group`` that ``uuid`` names, if any."""
        g = self._groups.get(group)
        return None if g is None else uuid_proposal(g, self._proposals, uuid)

    # ------------------------------------------------------------------ the host's checks

    def check(
        self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> Refused | None:
        """Would ``step`` refuse this input now? (``Fences.check``)"""
        return self._fences.check(kind, group, rank, payload)

    def repeat_of(
        self, kind: str, group: str | None, rank: int | None, payload: dict[str, Any]
    ) -> int | None:
        """The offset of the earlier input this one repeats, or None (``Fences.repeat_of``)."""
        return self._fences.repeat_of(kind, group, rank, payload)

    def current_beat(self, group: str | None, rank: int | None, payload: Any) -> bool:
        """Whether :meth:`check` accepts this heartbeat by its first test alone
        (``fencing.current_beat``); False says nothing."""
        return current_beat(self._groups, group, rank, payload)

    def beats_not_current(
        self, group: str, ranks: Sequence[int], payloads: Sequence[Any]
    ) -> list[int]:
        """The positions of the beats :meth:`current_beat` does not accept."""
        return beats_not_current(self._groups, group, ranks, payloads)

    def fence_epoch(self, group: str | None) -> int:
        """A number that changes whenever an accepted input of ``group`` may be refused now
        (``Fences.fence_epoch``); -1 for no such group."""
        return self._fences.fence_epoch(group)

    def next_deadline(self) -> int | None:
        """The earliest pending deadline (ns), or None (``Deadlines.next_deadline``)."""
        return self._deadlines.next_deadline()

    def waits_on_ranks(self) -> bool:
        """Whether a deadline waits on the ranks (``Deadlines.waits_on_ranks``)."""
        return self._deadlines.waits_on_ranks()

    # ------------------------------------------------------------------ a group's creation

    def _on_group_created(
        self, g: GroupState | None, record: Record, created: inputs.GroupCreatedInput, now: int
    ) -> list[Effect]:
        """A new group starts FORMING; creating an identical group again changes nothing."""
        group = record.group
        assert group is not None
        if g is not None:
            return []
        config = parse_group_created(created)
        self._groups[group] = GroupState(group, config, now, record.offset)
        return [GroupCreated(group=group, config=config, offset=record.offset)]
