"""Kill-to-recovery timing, the measure of every recovery row.

The clock starts just before the kill (``time.time()``, the workers' clock) and stops at the
last survivor's first line that says it recovered, each line stamped by the worker that
printed it (its ``t``). What "recovered" means is the scenario's: a success on a newer view,
a step committed without the dead rank, a quorum of the survivors.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from .workers import Lines


@dataclass(frozen=True)
class Recovery:
    killed_at: float
    #: each survivor's first line that said it recovered
    first: dict[Hashable, dict[str, Any]]

    @property
    def seconds(self) -> float:
        """From the kill to the last survivor's recovery."""
        return max(line["t"] for line in self.first.values()) - self.killed_at


def time_recovery(
    lines: Lines,
    kill: Callable[[], object],
    survivors: set[Any],
    recovered: Callable[[dict[str, Any], float], Hashable | None],
    timeout: float,
    what: str,
) -> Recovery:
    """Call ``kill()``, then read ``lines`` until every one of ``survivors`` has recovered:
    ``recovered(line, killed_at)`` names the survivor a line shows recovered (None: none)."""
    killed_at = time.time()
    kill()
    first: dict[Hashable, dict[str, Any]] = {}

    def done(line: dict[str, Any]) -> bool:
        who = recovered(line, killed_at)
        if who is not None and who in survivors:
            first.setdefault(who, line)
        return set(first) == survivors

    lines.until(done, timeout, what)
    return Recovery(killed_at, first)
