"""What the coordinator tells its operator: one INFO line per decision of the fold.

A rank lost and why (a clean exit or an ended run is not a loss, and says nothing), a view
committed with its members, cause and time, a group that failed to form, shut down or was
ended, and what each facet decides (``FacetHost.decisions``: a refit epoch's status). Each
line is built from one effect, so the log reads as the story the fold decided; what only
changes a rank's readiness stays quiet. The host says them for what it decides while serving,
not again for what it re-folds at a restart.
"""

from __future__ import annotations

import datetime as dt
import logging

from ..fold.effects import (
    OFFLINE,
    Effect,
    GroupEnded,
    GroupFailed,
    RankState,
    ShutdownWithSave,
    ViewCommitted,
)
from ..fold.reasons import ranks_text
from .facets import facet_decisions

log = logging.getLogger("foldplane.decisions")


def _utc(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts / 1e9, dt.UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


def decision(effect: Effect) -> str | None:
    """The line for ``effect``, or None for an effect that decides nothing an operator reads."""
    if isinstance(effect, RankState):
        if effect.state != OFFLINE or effect.reason.startswith(("exited", "group ended")):
            return None
        return f"group {effect.group} rank {effect.rank} lost: {effect.reason}"
    if isinstance(effect, ViewCommitted):
        v = effect.view
        cause = v.cause.get("kind", "?")
        detail = v.cause.get("detail")
        dropped = f"; dropped {ranks_text(v.dropped_ranks)}" if v.dropped_ranks else ""
        return (
            f"group {v.group} view {v.version} committed at {_utc(v.ts)}: active "
            f"{ranks_text(v.active_ranks)} ({cause}{': ' + detail if detail else ''}){dropped}"
        )
    if isinstance(effect, GroupFailed):
        return f"group {effect.group} failed to form: {effect.reason}"
    if isinstance(effect, ShutdownWithSave):
        return f"group {effect.group} shut down ({effect.reason}): {effect.detail}"
    if isinstance(effect, GroupEnded):
        return f"group {effect.group} {'deleted' if effect.deleted else 'ended'}: {effect.reason}"
    line = facet_decisions().get(type(effect))
    return None if line is None else line(effect)


def say(effects: list[Effect]) -> None:
    """Log the decisions among ``effects`` at INFO, in order."""
    if not log.isEnabledFor(logging.INFO):
        return
    for effect in effects:
        line = decision(effect)
        if line is not None:
            log.info("%s", line)
