"""A group that does not form: its formation deadline passed before its first view committed.

The rule. A group forms once ``min_ranks`` ranks are HEALTHY and its first view change
(``barrier.form``) commits. If no formation change is in flight and the group is
not shut down when its formation deadline (``formation_timeout``, from its creation) passes,
it fails to form, for good: a ``group_failed`` names how far it got and the ranks that were
not HEALTHY; it tracks no more deadlines (its ranks' last signs of life are kept for its
story), every later input naming it is refused, and its queued proposals are rejected.

Its interface: :func:`formation_failed` reads the group and returns the failure's decisions in
order; it changes nothing, and the machine applies them (``apply.py``). The tick decides when
(``deadlines.py``).
"""

from __future__ import annotations

from typing import Any

import msgspec

from ...eventlog.record import Record
from .effects import HEALTHY, GroupFailed
from .outcomes import Rejected
from .reasons import ranks_text
from .state import GroupState


class FormationFailed(msgspec.Struct, frozen=True, gc=False):
    """A decision: the group failed to form (``error`` says how far it got); it tracks no
    more deadlines, and its inputs are refused from now on."""

    error: str


def formation_failed(g: GroupState, deadline: int, record: Record) -> list[Any]:
    """The group was not formed by its formation ``deadline``: its decisions, in order (the
    failure, the ``group_failed`` effect naming the ranks not HEALTHY, its queued proposals
    rejected). It changes nothing."""
    missing = tuple(r for r, info in enumerate(g.ranks) if info.state != HEALTHY)
    ready = g.cfg.world_size - len(missing)
    error = (
        f"{ready}/{g.cfg.world_size} ranks HEALTHY by the formation deadline {deadline} "
        f"(min_ranks {g.cfg.min_ranks}); missing {ranks_text(missing)}"
    )
    queued = tuple(pid for pid, _ in g.queue)
    return [
        FormationFailed(error),
        GroupFailed(group=g.name, reason=error, missing_ranks=missing, offset=record.offset),
        Rejected(queued, f"group failed to form: {error}", dequeue=True),
    ]
