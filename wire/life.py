"""One status vocabulary: where a group's run stands and what became of its ranks, in the
words every surface uses: ``GET /groups`` and ``GET /groups/{group}`` (``status``,
``rank_counts``), the console, the command line's ``group list``/``group show``, the launcher,
the demo and the coordinator's decision log. Declared once, here; pure.

A run is ``forming`` until view 1 commits, then ``running``; it is over once it ``failed to
form``, ``finished`` (every rank that joined exited cleanly), was ``ended`` by the operator or
``deleted``; ``shut down`` is a run whose failure budget sent its one ``shutdown_with_save``
(its ranks save and leave). A rank is ``online`` (HEALTHY or SYNCED), ``exited cleanly`` (a
clean exit, never a failure), ``died`` (OFFLINE otherwise: a death, a timeout, a missed ACK)
or ``never joined``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# -- a run -------------------------------------------------------------------------------------

FORMING = "forming"
RUNNING = "running"
FAILED_TO_FORM = "failed to form"
SHUT_DOWN = "shut down"
FINISHED = "finished"
ENDED = "ended"
DELETED = "deleted"
#: the statuses of a run that takes nothing more (``group_ended``, ``group_failed``)
OVER = frozenset({FAILED_TO_FORM, FINISHED, ENDED, DELETED})

# -- a rank (the keys of ``rank_counts``, and their words) ----------------------------------------

ONLINE = "online"
EXITED = "exited"
DIED = "died"
NOT_JOINED = "not_joined"
RANK_WORDS = {ONLINE: "online", EXITED: "exited cleanly", DIED: "died", NOT_JOINED: "never joined"}


def run_status(
    *,
    formed: bool,
    failed: bool,
    shutdown: str | None,
    ended: bool,
    finished: bool,
    deleted: bool,
) -> str:
    """The one word for where a run stands (see the module docstring), most final first."""
    if deleted:
        return DELETED
    if finished:
        return FINISHED
    if ended:
        return ENDED
    if failed:
        return FAILED_TO_FORM
    if shutdown is not None:
        return SHUT_DOWN
    return RUNNING if formed else FORMING


def rank_tally(counts: Mapping[str, int]) -> str:
    """``"3 online, 1 died"``: each kind of rank there is, in a fixed order."""
    parts = [f"{counts[k]} {RANK_WORDS[k]}" for k in RANK_WORDS if counts.get(k)]
    return ", ".join(parts) or "none"


def run_text(doc: Mapping[str, Any]) -> str:
    """Where a run stands, in one line, from its ``GET /groups/{group}`` document or its
    ``GET /groups`` line: ``finished; view 2; 4 ranks: 4 exited cleanly``."""
    status = doc.get("status") or RUNNING
    ended = doc.get("ended")
    why = ""
    if status in (ENDED, DELETED):
        reason = ended.get("reason") if isinstance(ended, Mapping) else ended
        why = f" ({reason})" if reason else ""
    elif status == SHUT_DOWN:
        why = f" ({doc.get('shutdown')})"
    elif status == FAILED_TO_FORM:
        formation = doc.get("formation")
        error = formation.get("error") if isinstance(formation, Mapping) else None
        why = f" ({error})" if error else ""
    view = doc.get("view")
    version = view.get("version", 0) if isinstance(view, Mapping) else doc.get("version", 0)
    world_size = doc.get("world_size") or (doc.get("config") or {}).get("world_size", "?")
    tally = rank_tally(doc.get("rank_counts") or {})
    at = f"; view {version}" if version else ""
    return f"{status}{why}{at}; {world_size} ranks: {tally}"
