"""What a long poll gets back: the updates after its offset, or, when a journal no longer holds
them, a resync (the current state in their place)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from ..fold.machine import Coordinator
from .journal import Update, UpdateJournals, decoded, encoded
from .ready import HostState


@dataclass(frozen=True, slots=True)
class UpdatesAnswer:
    #: The updates as JSON, in offset order (the journals keep each update encoded once).
    encoded: list[msgspec.Raw]
    next_after: int
    resync: bool
    #: the reader was past the log's head: the log was restored from an older copy
    restored: bool = False

    @property
    def updates(self) -> list[Update]:
        return [decoded(raw) for raw in self.encoded]


def resync_answer(
    machine: Coordinator,
    state: HostState,
    journals: UpdateJournals,
    group: str,
    ranks: Sequence[int],
    view: int | None,
    *,
    applied: int,
    restored: bool = False,
) -> UpdatesAnswer:
    """The current state (see :meth:`HostState.resync`) as of ``applied``, the offset up to
    which every effect is carried out; ``ranks`` count as delivered up to there."""
    updates = state.resync(machine, group, ranks, view)
    journals.mark_delivered(group, ranks, applied)
    return UpdatesAnswer([encoded(u) for u in updates], applied, True, restored)
