"""What the coordinator tells its operator: one INFO line per decision of the fold.

A group created (its run's id and size), a rank joined (its incarnation) or left (a clean
exit), a rank lost and why (who reported its death, or when its last sign of life was), a
view committed with its members, cause and time, a group that failed to form, shut down, was
ended or finished (one line for an ending: the ``shutdown_with_save`` it sends is part of it),
and what each facet decides (``FacetHost.decisions``: a refit epoch's status). Each line is
built from one effect, so the log reads as the story the fold decided; what only changes a
rank's readiness stays quiet. Times are wall-clock UTC (the records' ``ts``), never raw
nanoseconds. The host says them for what it decides while serving, not again for what it
re-folds at a restart.
"""

from __future__ import annotations

import datetime as dt
import logging
import re

from ..fold.effects import (
    OFFLINE,
    Effect,
    GroupCreated,
    GroupEnded,
    GroupFailed,
    RankState,
    ShutdownWithSave,
    ViewCommitted,
)
from ..fold.reasons import ranks_text
from ..fold.state import FINISHED
from .facets import facet_decisions

log = logging.getLogger("foldplane.decisions")


def _utc(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts / 1e9, dt.UTC).strftime("%H:%M:%S.%f")[:-3] + "Z"


#: A record time (ns since the epoch, 19 digits) inside a reason the fold wrote.
_NS = re.compile(r"\b1\d{18}\b")


def _wall_clock(reason: str) -> str:
    """The fold's reason with each nanosecond timestamp in it written as UTC wall-clock time."""
    return _NS.sub(lambda m: _utc(int(m.group())), reason)


def decision(effect: Effect) -> str | None:
    """The line for ``effect``, or None for an effect that decides nothing an operator reads."""
    if isinstance(effect, RankState):
        who = f"group {effect.group} rank {effect.rank}"
        if effect.state != OFFLINE:
            if effect.reason.startswith(("joined", "rejoined")):
                return f"{who} joined: {effect.reason}"
            return None  # its readiness: quiet
        if effect.reason.startswith("group ended"):
            return None  # the ending's own line says it
        if effect.reason.startswith("exited"):
            return f"{who} left: {effect.reason}"
        return f"{who} lost: {_wall_clock(effect.reason)}"
    if isinstance(effect, GroupCreated):
        return (
            f"group {effect.group} created: {effect.config.world_size} ranks (run {effect.offset})"
        )
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
        if effect.reason == "ended":
            return None  # the ending's one line (GroupEnded) says it
        return f"group {effect.group} shut down ({effect.reason}): {effect.detail}"
    if isinstance(effect, GroupEnded):
        if effect.deleted:
            if effect.reason == FINISHED:
                return f"group {effect.group} deleted (its run had finished)"
            return f"group {effect.group} deleted: {effect.reason}"
        if effect.reason == FINISHED:
            return f"group {effect.group} finished: every rank exited cleanly"
        return f"group {effect.group} ended: {effect.reason}"
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
