"""The Coordinator: a pure, deterministic fold over the log, and the dispatcher of its rules.

``Coordinator.step(record) -> effects`` mutates the machine in place (h11-style) and returns
what the host must carry out. It does no I/O and reads no clock: time is the record's ``ts``
(clamped so it never runs backwards), and the host appends a ``tick`` once ``next_deadline()``
has passed. Iteration is always in a fixed order, so replaying a log gives byte-identical
effects, and ``snapshot()`` + the tail gives exactly what a full replay gives.

A step has two halves:

* the rule of its input (``TRANSITIONS``: the record's payload decoded into its Struct, one
  per kind in ``wire/inputs.py``) records the fact (a rank joined, beat, reported links,
  ACKed, exited, died; a proposal arrived; time passed) and runs the *death chain* when a rank
  is lost;
* :meth:`Coordinator._settle` then makes every decision that the new facts allow, in one fixed
  order: recompute the Healthy Set (unless a reconciliation window is open), enforce the failure
  budget, commit the change in flight once its barrier is complete, and otherwise start the next
  change: formation, then auto-deactivation, then the head of the proposal queue.

Heartbeats take a fast path that changes only liveness, so they never reach ``_settle``.

Each rule lives in a file of its own, whose docstring states it; the Coordinator is made of
them and dispatches to them:

==================  =======================================================================
``fencing.py``      which inputs are refused, checked before the append and again in the step
``ranks.py``        rank lifecycle and link evidence; the death chain
``healthy_set.py``  the Healthy Set: who is HEALTHY
``budget.py``       the failure budget: when a group shuts down for good
``proposals.py``    the proposal queue, what starts the next change (``reconfigure.py``: torch's)
``barrier.py``      the view change: prepare, ACKs, commit; formation failing
``deadlines.py``    ticks: the deadlines and what a resumed tick restarts
``ending.py``       a group's run over: ended by the operator, or finished
==================  =======================================================================

``stalls.py`` decides a view that failed with nobody blamed; ``barrier.py`` applies it.

State beside membership lives in *facets* (``coordinator/fold/facets.py``), each a package
the registry (``registry.py``) names: epoch plans and weight refits are two. A record of a
facet's kind is checked and stepped by the facet; every facet hears of each committed view,
each rank lost and each tick at fixed points of a step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec

from ...eventlog.record import Record
from ...wire import inputs
from ...wire.inputs import Input, decode
from .admission import admission_problem
from .barrier import ViewChange
from .budget import enforce_budget
from .capture import GroupCapture
from .config import GroupConfig
from .deadlines import Deadlines
from .effects import Effect, GroupCreated, Proposal, View
from .ending import GroupEnd
from .facets import Facet
from .fencing import REPEATABLE, Fences, parse_group_created
from .healthy_set import recompute_healthy_set
from .proposals import ProposalQueue
from .ranks import RankLifecycle
from .registry import Facets, default_facets
from .state import FAILED, FORMING, GroupState
from .status import group_status

#: Format 2 adds the facets' state, format 3 each rank's ``joined_version``; a snapshot of an
#: older format still restores (without facets; every links report counting, as it then did).
SNAPSHOT_FORMAT = 3
_READABLE_FORMATS = (1, 2, 3)

#: The transition table: each input (``wire/inputs.py``), its rule and what it moves; a heartbeat
#: (``_on_heartbeat``) and a tick (``_on_tick``) take their own paths, without ``_settle``.
TRANSITIONS: dict[type[Input], str] = {
    inputs.GroupCreatedInput: "_on_group_created",  # a new group: FORMING
    inputs.GroupEndedInput: "_on_group_ended",  # the group: ended, its changes rejected
    inputs.JoinInput: "_on_join",  # the rank: OFFLINE or another incarnation -> SYNCED
    inputs.LinksInput: "_on_links",  # the rank's evidence (worse: the window opens)
    inputs.AckInput: "_on_ack",  # the change in flight: the rank ACKed
    inputs.ExitInput: "_on_exit",  # the rank: -> OFFLINE, exited (no failure)
    inputs.DeathReportedInput: "_on_death_reported",  # the rank: -> OFFLINE, a failure
    inputs.ProposalInput: "_on_proposal",  # the queue: a proposal (or a call joins one)
}


class Coordinator(
    Fences,
    RankLifecycle,
    ProposalQueue,
    ViewChange,
    Deadlines,
    GroupEnd,
):
    """The fold. See the module docstring for the shape of a step."""

    def __init__(self, facets: Facets | None = None) -> None:
        #: its ``registry.Facets``: what it folds besides membership (the command line's if None)
        self.composition = facets or default_facets()
        self._offset = 0
        self._now = 0
        self._groups: dict[str, GroupState] = {}
        self._proposals: dict[int, Proposal] = {}
        self._transitions: dict[type[Input], Callable[[Record, Any, list[Effect]], None]] = {
            cls: getattr(self, rule) for cls, rule in TRANSITIONS.items()
        }
        self.facets: tuple[Facet, ...] = tuple(p.fold() for p in self.composition.plugins)
        self._facet_named: dict[str, Facet] = {f.name: f for f in self.facets}
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
            return self._on_heartbeat(record, now)
        if kind == "tick":
            return self._on_tick(record, decode(kind, record.payload))  # type: ignore[arg-type]
        refusal, inp = self._admit(kind, record.group, record.rank, record.payload)
        if refusal is not None:
            return [self._refused(record, refusal)]
        effects: list[Effect] = []
        facet = self._facet_of.get(kind)
        if facet is not None:
            facet.apply(self, record, effects)
            return effects
        if inp is None:  # accepted by a fast check, not decoded
            inp = decode(kind, record.payload)
        self._transitions[type(inp)](record, inp, effects)
        if (g := self._groups.get(record.group)) is not None:  # type: ignore[arg-type]
            self._settle(g, record, effects)
            self._finish_if_done(g, record, effects)  # after a clean exit (ending.py)
        return effects

    def _settle(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """Make every decision the current facts allow, in a fixed order (see module doc)."""
        if g.dirty and g.window_end is None:
            recompute_healthy_set(g, record, effects)
        enforce_budget(g, self._proposals, record, effects)
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
            if g.stall is not None and self._resolve_stall(g, record, effects):
                if g.shutdown is not None:
                    return
                continue
            if not self._decide_head(g, record, effects):
                return

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

    def _admission_problem(self, g: GroupState, target: tuple[int, ...]) -> str | None:
        """Why an activation to ``target`` cannot be admitted yet (``admission.py``), as the
        queue asks the machine: one name for the rule on the machine, where a test that breaks
        the rule on purpose replaces it."""
        return admission_problem(g, target)

    # ------------------------------------------------------------------ a group's creation

    def _on_group_created(
        self, record: Record, created: inputs.GroupCreatedInput, effects: list[Effect]
    ) -> None:
        """A new group starts FORMING; creating an identical group again changes nothing."""
        group = record.group
        assert group is not None
        if group in self._groups:
            return
        config = parse_group_created(created)
        self._groups[group] = GroupState(group, config, self._now, record.offset)
        effects.append(GroupCreated(group=group, config=config, offset=record.offset))
