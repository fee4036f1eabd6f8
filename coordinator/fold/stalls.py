"""A view that failed with every member alive: retried once, then decided by the evidence.

A collective that times out while every member's process is alive blames nobody: the data
plane's hint is all zeros, no down evidence reaches the Healthy Set, and no view change follows.
Left alone, the members would skip a step every collective timeout until a view change came
from elsewhere. So each member reports such a failure itself (a ``links`` report with
``failed: v``, and how many operations it had ``issued`` and ``completed`` on view v when it
failed), and the fold resolves it in bounded steps:

1. **Retry.** The first such failure of a view is retried: once the reconciliation window after
   the first report has passed (so that a real hint from another member, a rank going OFFLINE
   or a proposal is decided first), a view change with the same active ranks commits the next
   version (cause ``view_retry``), and every member builds a fresh backend for it.
2. **The evidence decides.** A retry view that fails blaming nobody before every member
   completed an operation on it failed *again*. Once every active member reported (or
   ``heartbeat_timeout`` after the first report), the *laggards* are the members that had issued
   fewer operations than the most any member issued (the others were waiting for them), and the
   members that never reported. With ``auto_deactivate_on_failure`` a view change without them
   commits (cause ``view_failed``); without it, active ranks are the upper layer's, and the
   laggards are named in a ``rank_state`` update.
3. **Nobody to blame.** When the evidence names nobody (every member issued as many operations),
   or everybody, or would leave fewer than ``min_active`` ranks, the fault cannot be located:
   the group gets its one ``shutdown_with_save`` (reason ``unresolved_view_failure``) instead of
   an unbounded loop of skipped steps.

A retry view on which every reporting member had completed at least one operation worked; a
later failure of it is a new incident and starts again at 1.

A stall is forgotten as soon as its view is no longer the committed one, a change is in flight,
or an active rank is not HEALTHY: then the view change comes from the other rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec

from .reasons import ranks_text


class StallReport(msgspec.Struct, frozen=True, gc=False):
    """A decision (``ranks.stall_report``): ``rank`` says the committed ``version`` failed here
    blaming nobody, having ``issued`` and ``completed`` so many operations on it; ``retry``:
    that view is a retry. The machine applies it (``apply.py``): the group's stall of that
    version keeps it, a new stall is begun for a newer version."""

    rank: int
    version: int
    retry: bool
    issued: int
    completed: int


class StallOver(msgspec.Struct, frozen=True, gc=False):
    """A decision (``barrier.resolve_stall``): the group's stall is over, decided or no longer
    about the current view; the machine forgets it (``apply.py``)."""


RETRY = "view_retry"
FAILED = "view_failed"
UNRESOLVED = "unresolved_view_failure"


class Stall:
    """The reports that the committed view ``version`` failed with nobody blamed."""

    __slots__ = ("version", "retry", "first_ts", "reports")

    def __init__(self, version: int, retry: bool, first_ts: int) -> None:
        self.version = version
        #: the failed view is itself a retry: its failure goes to the evidence (rule 2)
        self.retry = retry
        self.first_ts = first_ts
        #: rank -> (issued, completed) operations on the view when it failed there
        self.reports: dict[int, tuple[int, int]] = {}

    def deadline(self, reconcile_window_ns: int, heartbeat_timeout_ns: int) -> int:
        """When the fold decides without waiting for more reports."""
        return self.first_ts + (heartbeat_timeout_ns if self.retry else reconcile_window_ns)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "retry": self.retry,
            "first_ts": self.first_ts,
            "reports": [[r, i, c] for r, (i, c) in sorted(self.reports.items())],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Stall:
        stall = cls(d["version"], d["retry"], d["first_ts"])
        stall.reports = {r: (i, c) for r, i, c in d["reports"]}
        return stall


@dataclass(frozen=True)
class Decision:
    """What to do about a stall: ``kind`` is RETRY, FAILED (without ``laggards``) or UNRESOLVED;
    ``detail`` is the human reason, naming the view, the reporters and the counts."""

    kind: str
    detail: str
    laggards: tuple[int, ...] = ()


def decide(
    stall: Stall, active: tuple[int, ...], now: int, deadline: int, min_active: int
) -> Decision | None:
    """The decision the reports allow at ``now``, or None to wait for more (pure)."""
    reports = stall.reports
    everyone = all(r in reports for r in active)
    if not everyone and now < deadline:
        return None
    counts = ", ".join(f"{r}: {i}/{c}" for r, (i, c) in sorted(reports.items()))
    seen = (
        f"version {stall.version} failed with every member alive and nobody blamed "
        f"(issued/completed operations per reporting rank {{{counts}}})"
    )
    worked = everyone and all(c > 0 for _, c in reports.values())
    if not stall.retry or worked:
        again = "; its retry had worked, so this is a new failure" if stall.retry else ""
        return Decision(RETRY, f"{seen}{again}; retrying with the same members")
    most = max((i for i, _ in reports.values()), default=0)
    laggards = tuple(r for r in active if r not in reports or reports[r][0] < most)
    silent = [r for r in active if r not in reports]
    if not laggards or len(active) - len(laggards) < min_active:
        why = (
            "every member issued as many operations"
            if not laggards
            else f"removing the laggards {ranks_text(laggards)} would leave fewer than "
            f"min_active {min_active} ranks"
        )
        return Decision(UNRESOLVED, f"{seen} again after a retry, and {why}: nobody can be blamed")
    unreported = f"; no report from {ranks_text(silent)}" if silent else ""
    return Decision(
        FAILED,
        f"{seen} again after a retry: ranks {ranks_text(laggards)} had issued fewer than the "
        f"{most} operations others issued{unreported}",
        laggards,
    )
