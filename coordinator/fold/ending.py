"""A group's run ended by the operator (``POST /groups/{group}/end``).

The rule. Ending a group's run takes its online ranks OFFLINE as after a clean exit (never a
failure), drops the change in flight and rejects its proposals and the queued ones; unless the
group already failed or was shut down, its ranks get the group's one ``shutdown_with_save``
(reason ``ended``), naming the checkpoint rank of the view in force, as every shutdown does.
From then on every rank input, and creating the group again, is refused
with ``group_ended`` (``fencing.py``): a name is used once, so the old run's history (views,
proposals, stories) stays readable under it. Ending it again changes nothing; ``delete`` also
takes it out of the listings.
"""

from __future__ import annotations

from ...eventlog.record import Record
from ...wire.codes import REJECTED
from ...wire.inputs import GroupEndedInput
from .effects import Effect, GroupEnded, Proposal, ShutdownWithSave
from .facets import Facet
from .state import FAILED, GroupState


class GroupEnd:
    """See the module docstring."""

    # A part of the Coordinator (machine.py), whose methods run on it: the fold's state.
    _groups: dict[str, GroupState]
    _proposals: dict[int, Proposal]
    _now: int
    facets: tuple[Facet, ...]

    def _on_group_ended(
        self, record: Record, ended: GroupEndedInput, effects: list[Effect]
    ) -> None:
        """The operator ends the group's run (see the module docstring)."""
        g = self._groups[record.group]  # type: ignore[index]
        delete = ended.delete
        if g.ended is not None:
            g.deleted = g.deleted or delete
            effects.append(
                GroupEnded(group=g.name, reason=g.ended, deleted=g.deleted, offset=record.offset)
            )
            return
        reason = ended.reason or "ended by the operator"
        g.ended, g.ended_offset, g.deleted = reason, record.offset, delete
        change, g.change, g.window_end = g.change, None, None
        if change is not None:
            for pid in change.proposals:
                self._resolve(
                    g,
                    pid,
                    REJECTED,
                    None,
                    f"group ended before version {change.version} committed ({reason})",
                    record,
                    effects,
                )
        if g.shutdown is None and g.formation != FAILED:
            g.shutdown = "ended"
            effects.append(
                ShutdownWithSave(
                    group=g.name,
                    reason="ended",
                    detail=reason,
                    offset=record.offset,
                    checkpoint_rank=self._checkpoint_rank(g, g.active),
                )
            )
        while g.queue:
            pid, _ = g.queue.popleft()
            self._resolve(g, pid, REJECTED, None, f"group was ended ({reason})", record, effects)
        for rank in sorted(g.alive):
            g.ranks[rank].exited = True
            self._go_offline(g, rank, f"group ended: {reason}", False, record, effects)
        effects.append(
            GroupEnded(group=g.name, reason=reason, deleted=g.deleted, offset=record.offset)
        )
