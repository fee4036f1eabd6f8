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

from ...eventlog import ProjectionRow
from ...wire.protocol import View, prepare_update, view_update
from ...wire.updates import RankStateUpdate, ShutdownUpdate, ViewPrepareUpdate
from ..fold.effects import (
    Effect,
    GroupCreated,
    GroupEnded,
    GroupFailed,
    Proposal,
    ProposalResolved,
    RankState,
    Refused,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from ..fold.machine import Coordinator
from ..fold.projections import rank_state_update, rows_for, shutdown_update
from ..fold.registry import Facets
from .facets import facet_carry, facet_hosts
from .journal import Update, UpdateJournals

#: A projection row's identity: (kind, group, seq).
RowKey = tuple[str, str, int]


@dataclass
class HostState:
    """Host-side state derived from effects, kept in the snapshot so that a resync after a
    restart can still name the change in flight, each rank's state and a shutdown directive."""

    in_flight: dict[str, ViewPrepareUpdate] = field(default_factory=dict)
    rank_states: dict[str, dict[str, RankStateUpdate]] = field(default_factory=dict)
    shutdown: dict[str, ShutdownUpdate] = field(default_factory=dict)
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
        already holds its version ``view``), the change in flight, each rank's state, the
        facets' latest updates (:attr:`latest`, :attr:`latest_by_rank`) and what each facet
        reads from the fold now (:attr:`FacetHost.resync`: the epochs facet's parts) and the
        shutdown directive."""
        updates: list[Update] = []
        current = machine.current_view(group)
        if current is not None and current.version != view:
            updates.append(view_update(None, current))
        prepare = self.in_flight.get(group)
        if prepare is not None and (current is None or prepare.version > current.version):
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
        for facet in facet_hosts(machine.composition):
            if facet.resync is not None:
                updates.extend(facet.resync(machine, group, ranks))
        shutdown = self.shutdown.get(group)
        if shutdown is not None:
            updates.append(shutdown)
        updates.sort(key=_offset)
        return updates


def _offset(update: Update) -> int:
    return update.offset


@dataclass(slots=True)
class Ready:
    """Everything the effects of the records up to ``offset`` ask of the host.

    Carried out in this order: the projection rows are written (with the consumer offset)
    before the updates become visible to long polls and before the proposals' waiters and the
    listeners of the notices are answered, so whoever hears of a view can also read it in
    ``/views/history``.
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
    #: effects the calls waiting in this process hear of, last (``Host.listeners``): a
    #: facet's carry asks for it (the lighthouse answers its quorum calls so)
    notices: list[Effect] = field(default_factory=list)


class ReadyBuilder:
    """Turns effects into :class:`Ready` values, keeping the state the next ones are built on:
    ``state`` (the snapshot's host part) and each group's last committed view (the base of
    the next view update, a delta)."""

    def __init__(
        self, state: HostState, views: dict[str, View], facets: Facets | None = None
    ) -> None:
        self.state = state
        self.views = views
        #: the facets whose rows and effects it carries (the command line's when None)
        self.facets = facets

    @classmethod
    def for_machine(cls, machine: Coordinator, state: HostState) -> ReadyBuilder:
        """A builder that continues from ``machine``'s state (a restore)."""
        views = {
            group: view
            for group in machine.groups()
            if (view := machine.current_view(group)) is not None
        }
        return cls(state, views, machine.composition)

    def ready(self, offset: int, effects: Iterable[Effect], *, projected: int) -> Ready:
        """The Ready value of ``effects`` (those of the records up to ``offset``, in order).
        Rows are derived only for effects after ``projected``, the stored consumer offset."""
        ready = Ready(offset)
        rows = ready.rows
        carry = _CARRY
        facets = facet_carry(self.facets)
        for effect in effects:
            if effect.offset > projected:
                for row in rows_for(effect, self.facets):
                    rows[(row.kind, row.group, row.seq)] = row
            handler = carry.get(type(effect))
            if handler is not None:
                handler(self, effect, ready)
            elif (facet_handler := facets.get(type(effect))) is not None:
                facet_handler(self.state, effect, ready)
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
        if prepare is not None and prepare.version <= view.version:
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
}
