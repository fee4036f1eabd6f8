"""What a batch's effects ask of the host, as one value: etcd raft's ``Ready``.

The fold returns effects; :class:`ReadyBuilder` turns those of one batch into a :class:`Ready`
(the projection rows to write, the agent updates to publish, the proposals resolved, the inputs
fenced) and keeps the host-side state the updates are built from. It does no I/O: the host
carries the value out, in the order its fields are listed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from foldplane.coordinator.fold.effects import (
    AssignmentChanged,
    Effect,
    EpochCompleted,
    EpochPlanned,
    GroupCreated,
    GroupEnded,
    GroupFailed,
    PartSent,
    Proposal,
    ProposalResolved,
    RankState,
    RefitBootstrap,
    RefitEpochChanged,
    Refused,
    ShutdownWithSave,
    TransferChanged,
    ViewCommitted,
    ViewPrepare,
)
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.fold.projections import (
    data_assignment_update,
    data_assignment_updates,
    data_moves_update,
    epoch_complete_update,
    epoch_plan_update,
    rank_state_update,
    refit_bootstrap_update,
    refit_epoch_update,
    rows_for,
    shutdown_update,
    transfer_update,
)
from foldplane.coordinator.host.journal import Update, UpdateJournals
from foldplane.eventlog import ProjectionRow
from foldplane.wire.protocol import View, prepare_update, view_update

#: A projection row's identity: (kind, group, seq).
RowKey = tuple[str, str, int]


@dataclass
class HostState:
    """Host-side state derived from effects, kept in the snapshot so that a resync after a
    restart can still name the change in flight, each rank's state and a shutdown directive."""

    in_flight: dict[str, Update] = field(default_factory=dict)
    rank_states: dict[str, dict[str, Update]] = field(default_factory=dict)
    shutdown: dict[str, Update] = field(default_factory=dict)
    world_sizes: dict[str, int] = field(default_factory=dict)
    #: the latest update of each facet kind that stands for the current state, per group
    #: (``epoch_plan``, ``epoch_complete``, a refit's epoch and transfer) and per rank (a
    #: refit's bootstrap): a resync sends these instead of the history they replace. A rank's
    #: data part is not kept here: a resync reads it from the fold (see :meth:`resync`)
    latest: dict[str, dict[str, Update]] = field(default_factory=dict)
    latest_by_rank: dict[str, dict[str, dict[str, Update]]] = field(default_factory=dict)

    def resync(
        self, machine: Coordinator, group: str, ranks: Sequence[int], view: int | None
    ) -> list[Update]:
        """The current state of ``group`` for ``ranks``, in offset order, instead of updates a
        journal no longer holds: the view (in full, as a delta from nothing, unless the reader
        already holds its version ``view``), the change in flight, each rank's state, each
        rank's whole part of the group's epoch as the fold holds it now (``data_assignment``
        as of the epoch's latest decision: it stands for every ``data_moves`` before it) and
        the shutdown directive."""
        updates: list[Update] = []
        current = machine.current_view(group)
        if current is not None and current.version != view:
            updates.append(view_update(None, current))
        prepare = self.in_flight.get(group)
        if prepare is not None and (current is None or prepare["version"] > current.version):
            updates.append(prepare)
        states = self.rank_states.get(group, {})
        facet_ranks = self.latest_by_rank.get(group, {})
        updates.extend(self.latest.get(group, {}).values())
        for rank in ranks:
            state = states.get(str(rank))
            if state is not None:
                updates.append(state)
            # "data": a rank's part as snapshots before the fold was read here kept it
            updates.extend(u for k, u in facet_ranks.get(str(rank), {}).items() if k != "data")
        updates.extend(_parts(machine, group, ranks))
        shutdown = self.shutdown.get(group)
        if shutdown is not None:
            updates.append(shutdown)
        updates.sort(key=lambda u: u["offset"])
        return updates


def _parts(machine: Coordinator, group: str, ranks: Sequence[int]) -> list[Update]:
    """Each of ``ranks``' whole part of ``group``'s open (or last) epoch, as of its latest
    decision (a rank that holds nothing gets an empty part: what it held is no longer its)."""
    e = machine.epochs.epoch(group)
    if e is None:
        return []
    out = []
    for rank in ranks:
        h = e.holdings.get(rank)
        out.append(
            data_assignment_update(
                group=group,
                rank=rank,
                epoch=e.number,
                assignment=e.assignment,
                processed=0 if h is None else h.processed,
                remaining=[] if h is None else h.remaining_segments(),
                offset=e.decided,
            )
        )
    return out


@dataclass(slots=True)
class Ready:
    """Everything the effects of the records up to ``offset`` ask of the host.

    Carried out in this order: the projection rows are written (with the consumer offset)
    before the updates become visible to long polls and before the proposals' waiters are
    answered, so whoever hears of a view can also read it in ``/views/history``.
    """

    offset: int
    #: projection rows of the effects past the stored consumer offset, by identity
    rows: dict[RowKey, ProjectionRow] = field(default_factory=dict)
    #: the world size of each group created (the journals count undelivered updates by it)
    world_sizes: dict[str, int] = field(default_factory=dict)
    #: agent updates in offset order: (group, rank, update); rank None: the group's journal
    updates: list[tuple[str, int | None, Update]] = field(default_factory=list)
    #: groups whose view committed, once per commit
    committed: list[str] = field(default_factory=list)
    #: proposals that reached a terminal status
    resolved: list[Proposal] = field(default_factory=list)
    #: inputs the fold fenced while stepping, by offset
    refused: dict[int, Refused] = field(default_factory=dict)
    #: shutdown directives to show their checkpoint rank first: (group, rank, offset)
    saver_first: list[tuple[str, int, int]] = field(default_factory=list)


class ReadyBuilder:
    """Turns effects into :class:`Ready` values, keeping the state the next ones are built on:
    ``state`` (the snapshot's host part) and each group's last committed view (the base of
    the next view update, a delta)."""

    def __init__(self, state: HostState, views: dict[str, View]) -> None:
        self.state = state
        self.views = views

    @classmethod
    def for_machine(cls, machine: Coordinator, state: HostState) -> ReadyBuilder:
        """A builder that continues from ``machine``'s state (a restore)."""
        views = {
            group: view
            for group in machine.groups()
            if (view := machine.current_view(group)) is not None
        }
        return cls(state, views)

    def ready(self, offset: int, effects: Iterable[Effect], *, projected: int) -> Ready:
        """The Ready value of ``effects`` (those of the records up to ``offset``, in order).
        Rows are derived only for effects after ``projected``, the stored consumer offset."""
        ready = Ready(offset)
        rows = ready.rows
        carry = _CARRY
        for effect in effects:
            if effect.offset > projected:
                for row in rows_for(effect):
                    rows[(row.kind, row.group, row.seq)] = row
            handler = carry.get(type(effect))
            if handler is not None:
                handler(self, effect, ready)
        return ready

    # -- one handler per kind of effect; each returns nothing but what it adds to ``ready`` --

    def _view_prepare(self, effect: ViewPrepare, ready: Ready) -> None:
        """The change in flight is what a resync names until its view commits or fails."""
        update = prepare_update(
            group=effect.group,
            version=effect.version,
            base=self.views.get(effect.group),
            active_ranks=effect.active_ranks,
            participants=effect.participants,
            ack_deadline_ts=effect.ack_deadline_ts,
            offset=effect.offset,
        )
        self.state.in_flight[effect.group] = update
        ready.updates.append((effect.group, None, update))

    def _view_committed(self, effect: ViewCommitted, ready: Ready) -> None:
        """What a rank receives is what changed since the version before (``wire.protocol``)."""
        view = effect.view
        prepare = self.state.in_flight.get(view.group)
        if prepare is not None and prepare["version"] <= view.version:
            del self.state.in_flight[view.group]
        update = view_update(self.views.get(view.group), view)
        self.views[view.group] = view
        ready.committed.append(view.group)
        ready.updates.append((view.group, None, update))

    def _rank_state(self, effect: RankState, ready: Ready) -> None:
        update = rank_state_update(effect)
        self.state.rank_states.setdefault(effect.group, {})[str(effect.rank)] = update
        ready.updates.append((effect.group, effect.rank, update))

    def _shutdown(self, effect: ShutdownWithSave, ready: Ready) -> None:
        """Every rank gets the directive, its checkpoint rank first (``Host._carry_out``): it
        saves while the others still hold their state."""
        update = shutdown_update(effect)
        self.state.shutdown[effect.group] = update
        ready.updates.append((effect.group, None, update))
        if effect.checkpoint_rank is not None:
            ready.saver_first.append((effect.group, effect.checkpoint_rank, effect.offset))

    def _resolved(self, effect: ProposalResolved, ready: Ready) -> None:
        ready.resolved.append(effect.proposal)

    def _refused(self, effect: Refused, ready: Ready) -> None:
        ready.refused[effect.offset] = effect

    def _epoch_planned(self, effect: EpochPlanned, ready: Ready) -> None:
        """A new epoch: its plan replaces the last one's (and its end) in a resync."""
        update = epoch_plan_update(effect)
        latest = self.state.latest.setdefault(effect.group, {})
        latest.pop("epoch_end", None)
        latest["epoch"] = update
        ready.updates.append((effect.group, None, update))
        self._assignments(effect, ready)

    def _assignments(self, effect: EpochPlanned, ready: Ready) -> None:
        """The first split: each rank's part, on its own journal."""
        for update in data_assignment_updates(effect):
            ready.updates.append((effect.group, update["rank"], update))

    def _moves(self, effect: AssignmentChanged, ready: Ready) -> None:
        """A later decision: its moves, once, on the group's journal (every agent applies them
        to its own part; a resync sends the parts instead)."""
        ready.updates.append((effect.group, None, data_moves_update(effect)))

    def _part_sent(self, effect: PartSent, ready: Ready) -> None:
        """A new incarnation's part, whole, on its own journal (after the decisions it may
        read first: the part stands for them and for its predecessors' reports)."""
        update = data_assignment_update(
            group=effect.group,
            rank=effect.rank,
            epoch=effect.epoch,
            assignment=effect.assignment,
            processed=effect.processed,
            remaining=effect.remaining,
            offset=effect.offset,
        )
        ready.updates.append((effect.group, effect.rank, update))

    def _epoch_completed(self, effect: EpochCompleted, ready: Ready) -> None:
        update = epoch_complete_update(effect)
        self.state.latest.setdefault(effect.group, {})["epoch_end"] = update
        ready.updates.append((effect.group, None, update))

    def _refit_epoch(self, effect: RefitEpochChanged, ready: Ready) -> None:
        """Every worker of both groups follows the refit's epoch; a new epoch's bootstrap is
        not its predecessor's, so a resync stops sending the old one."""
        update = refit_epoch_update(effect)
        for group in effect.groups:
            self.state.latest.setdefault(group, {})[f"refit:{effect.refit}"] = update
            for by_kind in self.state.latest_by_rank.get(group, {}).values():
                by_kind.pop(f"refit_bootstrap:{effect.refit}", None)
            ready.updates.append((group, None, update))

    def _transfer(self, effect: TransferChanged, ready: Ready) -> None:
        update = transfer_update(effect)
        for group in effect.groups:
            self.state.latest.setdefault(group, {})[f"transfer:{effect.refit}"] = update
            ready.updates.append((group, None, update))

    def _refit_bootstrap(self, effect: RefitBootstrap, ready: Ready) -> None:
        """The rendezvous goes to the admitted members' own journals, nowhere else."""
        update = refit_bootstrap_update(effect)
        for group, rank in effect.members:
            by_rank = self.state.latest_by_rank.setdefault(group, {})
            by_rank.setdefault(str(rank), {})[f"refit_bootstrap:{effect.refit}"] = update
            ready.updates.append((group, rank, update))

    def _group_created(self, effect: GroupCreated, ready: Ready) -> None:
        # A group is created once (a second identical create changes nothing), before any
        # update of it, so its size can be set ahead of the batch's updates.
        size = int(effect.config.world_size)
        self.state.world_sizes[effect.group] = size
        ready.world_sizes[effect.group] = size

    def _group_failed(self, effect: GroupFailed | GroupEnded, ready: Ready) -> None:
        # a group that failed to form or was ended has no change in flight any more
        self.state.in_flight.pop(effect.group, None)


def publish(journals: UpdateJournals, ready: Ready) -> None:
    """Hand a Ready's agent updates to the journals (the world sizes first). Readers see them
    only once :meth:`UpdateJournals.wake` is called, after the projection rows are written."""
    for group, size in ready.world_sizes.items():
        journals.set_world_size(group, size)
    for group, rank, update in ready.updates:
        if rank is None:
            journals.publish_group(group, update)
        else:
            journals.publish_rank(group, rank, update)


#: The effects that ask the host for more than their projection rows, and who handles each.
_CARRY: dict[type[Effect], Callable[[ReadyBuilder, Any, Ready], None]] = {
    ViewPrepare: ReadyBuilder._view_prepare,
    ViewCommitted: ReadyBuilder._view_committed,
    RankState: ReadyBuilder._rank_state,
    ShutdownWithSave: ReadyBuilder._shutdown,
    ProposalResolved: ReadyBuilder._resolved,
    Refused: ReadyBuilder._refused,
    GroupCreated: ReadyBuilder._group_created,
    GroupFailed: ReadyBuilder._group_failed,
    GroupEnded: ReadyBuilder._group_failed,
    EpochPlanned: ReadyBuilder._epoch_planned,
    AssignmentChanged: ReadyBuilder._moves,
    EpochCompleted: ReadyBuilder._epoch_completed,
    PartSent: ReadyBuilder._part_sent,
    RefitEpochChanged: ReadyBuilder._refit_epoch,
    TransferChanged: ReadyBuilder._transfer,
    RefitBootstrap: ReadyBuilder._refit_bootstrap,
}
