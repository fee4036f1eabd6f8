"""A group's run is over: ended by the operator (``POST /groups/{group}/end``), or finished.

The rule. A run of a group (its id: the offset of its ``group_created`` record) is over once
the operator ended it, or once it *finished*: it formed and every rank that joined has exited
cleanly (the last ``exit`` ends it, in the same step). Ending a group's run takes its online ranks OFFLINE as after a clean exit (never a
failure), drops the change in flight and rejects its proposals and the queued ones; unless the
group already failed or was shut down, its ranks get the group's one ``shutdown_with_save``
(reason ``ended``), naming the checkpoint rank of the view in force, as every shutdown does.
A finished run has no rank left to tell, so it sends no ``shutdown_with_save``; its
queued proposals are rejected as an ended run's are.
From then on every input that names the group (a join, heartbeat, links report, ACK, exit,
death report, proposal, a facet's report or plan), and creating the group again, is refused
with ``group_ended`` (``fencing.py``), and no tick visits it (``deadlines.py``): a name is used
once, so the old run's history (views, proposals, stories) stays as it was when the run ended,
readable under its name. Ending it again changes nothing; ``delete`` also takes it out of the
listings.
"""

from __future__ import annotations

from ...eventlog.record import Record
from ...wire.codes import REJECTED
from ...wire.inputs import GroupEndedInput
from .apply import DeathChain
from .budget import checkpoint_rank
from .effects import Effect, GroupEnded, Proposal, ShutdownWithSave
from .outcomes import resolve
from .state import FAILED, FINISHED, GroupState


class GroupEnd:
    """The end of every group's run (see the module docstring).

    It reads the group it is handed and resolves the proposals (``proposals``) the end
    rejects; the ranks it takes OFFLINE go down the death chain (``apply.Applier.go_offline``)."""

    def __init__(self, proposals: dict[int, Proposal], ranks: DeathChain) -> None:
        self._proposals = proposals
        self._ranks = ranks

    def on_group_ended(
        self, g: GroupState, record: Record, ended: GroupEndedInput, now: int
    ) -> list[Effect]:
        """The operator ends the group's run (see the module docstring). It changes the group
        itself, and returns the effects."""
        delete = ended.delete
        if g.ended is not None:
            g.deleted = g.deleted or delete
            return [
                GroupEnded(group=g.name, reason=g.ended, deleted=g.deleted, offset=record.offset)
            ]
        effects: list[Effect] = []
        self._end(g, ended.reason or "ended by the operator", delete, record, effects)
        return effects

    def finish_if_done(self, g: GroupState, record: Record, effects: list[Effect]) -> None:
        """A formed run whose every joined rank has exited cleanly is finished (module doc)."""
        if g.ended is not None or g.view is None or g.alive:
            return
        ranks = g.ranks
        if any(info.incarnation is not None and not info.exited for info in ranks):
            return
        g.finished, g.stall = True, None
        self._end(g, FINISHED, False, record, effects)

    def _end(
        self, g: GroupState, reason: str, delete: bool, record: Record, effects: list[Effect]
    ) -> None:
        g.ended, g.ended_offset, g.deleted = reason, record.offset, delete
        change, g.change, g.window_end = g.change, None, None
        if change is not None:
            for pid in change.proposals:
                resolve(
                    self._proposals,
                    pid,
                    REJECTED,
                    None,
                    f"group ended before version {change.version} committed ({reason})",
                    record,
                    effects,
                )
        if g.shutdown is None and g.formation != FAILED and not g.finished:
            g.shutdown = "ended"
            effects.append(
                ShutdownWithSave(
                    group=g.name,
                    reason="ended",
                    detail=reason,
                    offset=record.offset,
                    checkpoint_rank=checkpoint_rank(g, g.active),
                )
            )
        while g.queue:
            pid, _ = g.queue.popleft()
            resolve(
                self._proposals, pid, REJECTED, None, f"group was ended ({reason})", record, effects
            )
        for rank in sorted(g.alive):
            g.ranks[rank].exited = True
            self._ranks.go_offline(g, rank, f"group ended: {reason}", False, record, effects)
        effects.append(
            GroupEnded(group=g.name, reason=reason, deleted=g.deleted, offset=record.offset)
        )
