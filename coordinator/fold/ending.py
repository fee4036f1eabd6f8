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

Its interface: :func:`on_group_ended` (the operator's input) and :func:`finish_if_done` (after
every step of the group) read the group and return the end's decisions in order (``RunEnd``,
``EndShutdown``, ``Deleted``; the proposals' ``outcomes.Rejected``; each online rank's
``ranks.Exited`` and ``ranks.Lost``; the ``group_ended`` effect); they change nothing, and the
machine applies them (``apply.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from ...eventlog.record import Record
from ...wire.inputs import GroupEndedInput
from .budget import checkpoint_rank
from .effects import GroupEnded
from .outcomes import Rejected
from .ranks import Exited, Lost
from .state import FAILED, FINISHED, GroupState


class RunEnd(msgspec.Struct, frozen=True, gc=False):
    """A decision: the run is over for ``reason`` (``delete``: out of the listings;
    ``finished``: every rank exited cleanly, a stall forgotten); the change in flight and an
    open window are dropped."""

    reason: str
    delete: bool
    finished: bool


class EndShutdown(msgspec.Struct, frozen=True, gc=False):
    """A decision: the group's one ``shutdown_with_save``, reason ``ended`` (``detail``: why
    the run ended), naming ``checkpoint_rank``."""

    detail: str
    checkpoint_rank: int | None


class Deleted(msgspec.Struct, frozen=True, gc=False):
    """A decision: an ended run leaves the listings (its history stays)."""


def on_group_ended(g: GroupState, record: Record, ended: GroupEndedInput, now: int) -> list[Any]:
    """The operator ends the group's run (see the module docstring); ending it again changes
    nothing but ``delete``."""
    if g.ended is not None:
        deleted = g.deleted or ended.delete
        told = GroupEnded(group=g.name, reason=g.ended, deleted=deleted, offset=record.offset)
        return [Deleted(), told] if deleted and not g.deleted else [told]
    return _end(g, ended.reason or "ended by the operator", ended.delete, False, record)


def finish_if_done(g: GroupState, record: Record) -> Sequence[Any]:
    """A formed run whose every joined rank has exited cleanly is finished (module doc)."""
    if g.ended is not None or g.view is None or g.alive:
        return ()
    if any(info.incarnation is not None and not info.exited for info in g.ranks):
        return ()
    return _end(g, FINISHED, False, True, record)


def _end(g: GroupState, reason: str, delete: bool, finished: bool, record: Record) -> list[Any]:
    decisions: list[Any] = [RunEnd(reason, delete, finished)]
    change = g.change
    if change is not None:
        why = f"group ended before version {change.version} committed ({reason})"
        decisions.append(Rejected(tuple(change.proposals), why))
    if g.shutdown is None and g.formation != FAILED and not finished:
        decisions.append(EndShutdown(reason, checkpoint_rank(g, g.active)))
    queued = tuple(pid for pid, _ in g.queue)
    decisions.append(Rejected(queued, f"group was ended ({reason})", dequeue=True))
    for rank in sorted(g.alive):
        decisions += (Exited(rank), Lost(rank, f"group ended: {reason}", False))
    decisions.append(GroupEnded(group=g.name, reason=reason, deleted=delete, offset=record.offset))
    return decisions
