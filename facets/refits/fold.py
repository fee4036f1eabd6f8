"""Weight refits between two groups (the ``refits`` facet, docs/refit.md).

A refit moves a model's weights from a *publisher* group (trainers, M slots) to a *subscriber*
group (generators, N slots), again and again, over a data plane of its own
(``agent.refit``). The plan of what moves is the workers' (``wire.refit``); the fold decides who
takes part, when they agree, and what happened to each transfer:

- **Declared** (``refit_created``, ``POST /refits``): the two groups, the slot counts, the
  lane count (the data plane's parallel streams), the readiness and transfer timeouts, and
  optionally the plan digest every worker must hold. Created again with the same definition
  is the same refit; with another one it is refused ``refit_conflict``.
- **Epochs.** Everything a worker does is fenced by the refit's *epoch*. An epoch begins
  ``waiting``: each worker joins (``refit_join``) with its slot and the digest of the plan it
  holds. It is ``admitted`` once every slot joined with the same digest: each member gets its
  rank in the refit's world (publishers first, by slot). The epoch moves on (a new one begins,
  ``waiting``) when either group commits a view, when a member goes OFFLINE, when a transfer
  times out, or on an operator's restart (``refit_restart``): a worker still holding the old
  epoch is refused ``stale_refit_epoch`` naming why it moved, never left to retry on a stale
  communicator. An epoch not admitted by its readiness deadline is ``timed_out`` and names
  the slots that never joined.
- **Gates.** A join is refused when the worker's group is neither of the refit's, when its
  rank is not active in its group's committed view, when its slot is out of range or held by
  another rank, or when its digest differs from the refit's (the message names who holds
  which digest).
- **Bootstrap.** Refit rank 0 (publisher slot 0) publishes the data plane's rendezvous, once
  per admitted epoch: offered with its join (``refit_join`` with ``bootstrap``), it is
  published in the step that admits the epoch; else it comes after admission
  (``refit_bootstrap``). It reaches the admitted members' own update journals only, and no
  status or projection row carries it.
- **Transfers** (``transfer``): created by a publisher of the admitted epoch or an operator
  (the publishers hold the weights; a subscriber waits for the transfer to start and is
  refused ``not_refit_member``), idempotent by key; one runs at a time. Each member reports ``done`` or ``failed``
  (``transfer_status``) against the transfer's current attempt and the epoch; the transfer
  completes when every member reported ``done``, and a completed transfer is final (a late or
  repeated report is refused ``transfer_final``). A failure (a report, a member lost, the
  epoch moving, the deadline) fails the attempt, naming who or what; creating the transfer
  again starts a new attempt, and the old attempt's reports are refused ``stale_attempt``.

Every rule is a method below; iteration is in a fixed order, so a replay decides the same.
"""

from __future__ import annotations

from typing import Any

from msgspec import UNSET

from ...coordinator.fold.effects import Effect, RankState, View
from ...coordinator.fold.facets import FoldContext, Refusal
from ...coordinator.fold.reasons import abridged
from ...coordinator.fold.state import GroupState
from ...eventlog.record import Record
from .checks import RefitChecks
from .effects import (
    RefitBootstrap,
    RefitCreated,
)
from .inputs import (
    RefitBootstrapInput,
    RefitCreatedInput,
    RefitJoinInput,
    RefitRestartInput,
    RefitsInput,
    TransferInput,
    TransferStatusInput,
    decode,
)
from .reads import RefitsReads, read_model, refit_status
from .state import (
    _S,
    ADMITTED,
    COMPLETED,
    FAILED,
    PUBLISHER,
    RUNNING,
    TIMED_OUT,
    WAITING,
    Refit,
    _Joined,
    _slot_name,
    _Transfer,
)

#: The transition table: each input (``inputs.py``), the rule that steps it and what it moves.
TRANSITIONS: dict[type[RefitsInput], str] = {
    RefitCreatedInput: "_on_created",  # a new refit: its first epoch, waiting for its slots
    RefitRestartInput: "_on_restart",  # the running transfer fails; a new epoch
    RefitJoinInput: "_join",  # a slot held (the last one: the epoch admitted)
    RefitBootstrapInput: "_on_bootstrap",  # the epoch's rendezvous, to its members
    TransferInput: "_transfer",  # a transfer starts (or retries)
    TransferStatusInput: "_status",  # a member's outcome (failed: the transfer fails)
}


class Refits:
    """The refits facet (see the module docstring)."""

    name = "refits"
    kinds = frozenset(
        {
            "refit_created",
            "refit_restart",
            "refit_join",
            "refit_bootstrap",
            "transfer",
            "transfer_status",
        }
    )
    repeatable = frozenset({"refit_created", "refit_join", "refit_bootstrap", "transfer"})

    def __init__(self) -> None:
        self._refits: dict[str, Refit] = {}
        #: its refusals and repeats (``checks.py``), reading the same refits
        self._checks = RefitChecks(self._refits)
        #: the refits a record changed since the last read model (``reads.py``)
        self._moved: set[str] = set()

    # -- reading -----------------------------------------------------------------------------

    def refit(self, name: str) -> Refit | None:
        return self._refits.get(name)

    def names(self) -> list[str]:
        return sorted(self._refits)

    def status(self, name: str) -> dict[str, Any] | None:
        """Plain data for ``GET /refits/{refit}`` (never the bootstrap)."""
        r = self._refits.get(name)
        return None if r is None else refit_status(r)

    def read_model(self, previous: RefitsReads | None) -> RefitsReads:
        """See ``coordinator.fold.facets.Facet.read_model`` and ``reads.py``."""
        if previous is None:
            return read_model(self._refits, None, set())
        moved, self._moved = self._moved, set()
        return read_model(self._refits, previous, moved)

    # -- checks (checks.py) -------------------------------------------------------------------

    def refusal(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> Refusal | None:
        return self._checks.refusal(fold, kind, group, rank, payload)

    def repeat_of(
        self, fold: FoldContext, kind: str, group: str | None, rank: int | None, payload: Any
    ) -> int | None:
        return self._checks.repeat_of(fold, kind, group, rank, payload)

    # -- steps -------------------------------------------------------------------------------

    def apply(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        """Step an input: its Struct (``inputs.py``) picks the rule (:data:`TRANSITIONS`)."""
        inp = decode(record.kind, record.payload)
        self._moved.add(inp.refit)
        getattr(self, TRANSITIONS[type(inp)])(fold, inp, record, effects)

    def _on_created(
        self, fold: FoldContext, created: RefitCreatedInput, record: Record, effects: list[Effect]
    ) -> None:
        # the definition is the record's payload as logged (every field explicit)
        r = self._refits[created.refit] = Refit(dict(record.payload), record.offset)
        effects.append(RefitCreated(refit=r.name, spec=r.spec, offset=record.offset))
        self._new_epoch(fold, r, "the refit was created", record, effects)

    def _on_restart(
        self, fold: FoldContext, restart: RefitRestartInput, record: Record, effects: list[Effect]
    ) -> None:
        r = self._refits[restart.refit]
        reason = restart.reason or "an operator restarted it"
        self._fail_running(r, f"the refit was restarted ({reason})", record, effects)
        self._new_epoch(fold, r, f"restarted by an operator: {reason}", record, effects)

    def _on_bootstrap(
        self, fold: FoldContext, boot: RefitBootstrapInput, record: Record, effects: list[Effect]
    ) -> None:
        self._publish(self._refits[boot.refit], boot.bootstrap, record, effects)

    def _new_epoch(
        self,
        fold: FoldContext,
        r: Refit,
        cause: str,
        record: Record,
        effects: list[Effect],
        lost: tuple[str, int] | None = None,
    ) -> None:
        r.epoch += 1
        r.status = WAITING
        r.cause = cause
        r.lost = lost
        r.joined = {}
        r.bootstrap = None
        r.missing = ()
        r.digest = r.spec["digest"]
        r.deadline = fold.now + round(r.spec["readiness_timeout_s"] * _S)
        effects.append(r.epoch_effect(record.offset))

    def _join(
        self, fold: FoldContext, join: RefitJoinInput, record: Record, effects: list[Effect]
    ) -> None:
        """The last slot's join admits the epoch; a bootstrap publisher slot 0 offered with its
        join is published in the same step, after the admission (to the members it names)."""
        r = self._refits[join.refit]
        role = r.role_of(record.group)  # type: ignore[arg-type]
        assert role is not None and record.rank is not None
        offered = join.bootstrap
        r.joined[(role, join.slot)] = _Joined(
            record.group,  # type: ignore[arg-type]
            record.rank,
            join.incarnation,
            join.digest,
            record.offset,
            None if offered is UNSET else dict(offered),
        )
        if r.digest is None:
            r.digest = join.digest
        if len(r.joined) == len(r.every_slot()):
            r.status = ADMITTED
            r.deadline = None
            effects.append(r.epoch_effect(record.offset))
            offered = r.joined[(PUBLISHER, 0)].bootstrap
            if r.bootstrap is None and offered is not None:
                self._publish(r, offered, record, effects)

    @staticmethod
    def _publish(
        r: Refit, bootstrap: dict[str, Any], record: Record, effects: list[Effect]
    ) -> None:
        """The epoch's bootstrap, to the admitted members' own journals (nowhere else)."""
        r.bootstrap = dict(bootstrap)
        effects.append(
            RefitBootstrap(
                refit=r.name,
                epoch=r.epoch,
                bootstrap=r.bootstrap,
                members=tuple((m["group"], m["rank"]) for m in r.members()),
                offset=record.offset,
            )
        )

    def _transfer(
        self, fold: FoldContext, start: TransferInput, record: Record, effects: list[Effect]
    ) -> None:
        r = self._refits[start.refit]
        key = start.key
        t = RefitChecks.transfer_by_key(r, key)
        if t is None:
            number = len(r.transfers) + 1
            t = r.transfers[number] = _Transfer(number, key, record.offset)
            r.by_key[key] = number
        t.attempt += 1
        t.epoch = r.epoch
        t.status = RUNNING
        t.detail = f"attempt {t.attempt} in epoch {r.epoch}"
        t.done = set()
        t.offset = record.offset
        t.deadline = fold.now + round(r.spec["transfer_timeout_s"] * _S)
        r.running = t.id
        effects.append(r.transfer_effect(t, record.offset))

    def _status(
        self, fold: FoldContext, report: TransferStatusInput, record: Record, effects: list[Effect]
    ) -> None:
        r = self._refits[report.refit]
        t = r.transfers[report.transfer]
        slot = r.member_slot(record.group, record.rank)  # type: ignore[arg-type]
        assert slot is not None
        if report.status == "failed":
            j = r.joined[slot]
            said = f": {report.detail}" if report.detail else ""
            self._fail(
                r,
                t,
                f"{_slot_name(*slot, j.group, j.rank)} reported failure{said}",
                record,
                effects,
            )
            return
        if slot in t.done:
            return
        t.done.add(slot)
        if len(t.done) == len(r.every_slot()):
            t.status = COMPLETED
            t.detail = f"every slot reported done (attempt {t.attempt}, epoch {t.epoch})"
            t.deadline = None
            r.running = None
            effects.append(r.transfer_effect(t, record.offset))

    def _fail(
        self, r: Refit, t: _Transfer, detail: str, record: Record, effects: list[Effect]
    ) -> None:
        t.status = FAILED
        t.detail = detail
        t.deadline = None
        r.running = None
        effects.append(r.transfer_effect(t, record.offset))

    def _fail_running(self, r: Refit, detail: str, record: Record, effects: list[Effect]) -> None:
        if r.running is not None:
            self._fail(r, r.transfers[r.running], detail, record, effects)

    # -- hooks -------------------------------------------------------------------------------

    def view_committed(
        self,
        fold: FoldContext,
        g: GroupState,
        view: View,
        base: View | None,
        record: Record,
        effects: list[Effect],
    ) -> None:
        """A view of either group moves every refit over it to a new epoch: its communicators
        were built over the old membership."""
        for name in sorted(self._refits):
            r = self._refits[name]
            role = r.role_of(g.name)
            if role is None:
                continue
            self._moved.add(name)
            cause = f"view {view.version} of {role} group {g.name!r} committed"
            self._fail_running(r, f"the refit's epoch moved: {cause}", record, effects)
            self._new_epoch(fold, r, cause, record, effects)

    def rank_joined(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """A replacement joins a refit through its own ``refit_join``: nothing to do here."""

    def rank_lost(
        self, fold: FoldContext, g: GroupState, rank: int, record: Record, effects: list[Effect]
    ) -> None:
        """A member of a refit's current epoch went OFFLINE: the running attempt fails naming
        it, and the epoch moves (the survivors must not go on with a world that lost a rank)."""
        for name in sorted(self._refits):
            r = self._refits[name]
            slot = r.member_slot(g.name, rank)
            if slot is None:
                continue
            self._moved.add(name)
            who = _slot_name(*slot, g.name, rank)
            reason = next(
                (
                    e.reason
                    for e in reversed(effects)
                    if isinstance(e, RankState) and e.group == g.name and e.rank == rank
                ),
                "",
            )
            what = f"{who} went OFFLINE" + (f" ({reason})" if reason else "")
            self._fail_running(r, what, record, effects)
            self._new_epoch(fold, r, what, record, effects, lost=slot)

    def tick(self, fold: FoldContext, record: Record, effects: list[Effect]) -> None:
        now = fold.now
        for name in sorted(self._refits):
            r = self._refits[name]
            if r.status == WAITING and r.deadline is not None and now >= r.deadline:
                self._moved.add(name)
                r.status = TIMED_OUT
                r.missing = tuple(RefitChecks.missing(r))
                r.deadline = None
                effects.append(r.epoch_effect(record.offset))
            if r.running is not None:
                t = r.transfers[r.running]
                if t.deadline is not None and now >= t.deadline:
                    self._moved.add(name)
                    waiting = [_slot_name(*s) for s in r.every_slot() if s not in t.done]
                    detail = (
                        f"timed out after {r.spec['transfer_timeout_s']:g} s; no done from "
                        f"{abridged(waiting)}"
                    )
                    self._fail(r, t, detail, record, effects)
                    self._new_epoch(
                        fold,
                        r,
                        f"transfer {t.key!r} attempt {t.attempt} timed out",
                        record,
                        effects,
                    )

    def next_deadline(self) -> int | None:
        deadlines = []
        for r in self._refits.values():
            if r.status == WAITING and r.deadline is not None:
                deadlines.append(r.deadline)
            if r.running is not None and r.transfers[r.running].deadline is not None:
                deadlines.append(r.transfers[r.running].deadline)
        return min(deadlines, default=None)

    def waits_on_ranks(self) -> bool:
        return self.next_deadline() is not None

    def resume(self, now: int) -> None:
        """The coordinator was down: the ranks could not join or report meanwhile, so each
        deadline starts again from now."""
        self._moved.update(self._refits)
        for r in self._refits.values():
            if r.status == WAITING and r.deadline is not None:
                r.deadline = now + round(r.spec["readiness_timeout_s"] * _S)
            if r.running is not None:
                t = r.transfers[r.running]
                t.deadline = now + round(r.spec["transfer_timeout_s"] * _S)

    def snapshot(self) -> dict[str, Any]:
        return {"refits": [self._refits[n].to_dict() for n in sorted(self._refits)]}

    def restore(self, data: dict[str, Any]) -> None:
        self._refits.clear()  # in place: the checks read the same dict
        self._refits.update(
            {d["spec"]["refit"]: Refit.from_dict(d) for d in data.get("refits", [])}
        )
        self._moved = set(self._refits)
