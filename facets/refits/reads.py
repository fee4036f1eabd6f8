"""The refits facet's read model: what its routes and console panel read, as the host publishes
it once per cycle (``coordinator/fold/facets.py``, ``Facet.read_model``).

Each refit's status (``GET /refits/{refit}``'s data) is rendered when a record changed that
refit (one of its own inputs, a view or a lost rank of one of its groups, a deadline of its
own); every other refit's is the model before's, shared. ``status`` hands out a fresh
top-level dict (a reader may edit it; the lists in it are shared and never edited).
"""

from __future__ import annotations

from typing import Any

from ...coordinator.fold.facets import rerendered
from .checks import RefitChecks
from .state import Refit


def refit_status(r: Refit) -> dict[str, Any]:
    """Plain data for ``GET /refits/{refit}`` (never the bootstrap)."""
    joined = {f"{role}:{slot}": j for (role, slot), j in r.joined.items()}
    return {
        "refit": r.name,
        "spec": r.spec,
        "created_offset": r.offset,
        "epoch": r.epoch,
        "status": r.status,
        "cause": r.cause,
        "deadline_ts": r.deadline,
        "digest": r.digest,
        "joined": [
            {
                "role": key.split(":")[0],
                "slot": int(key.split(":")[1]),
                "group": j.group,
                "rank": j.rank,
                "digest": j.digest,
            }
            for key, j in sorted(
                joined.items(), key=lambda kv: (kv[0].split(":")[0], int(kv[0].split(":")[1]))
            )
        ],
        "missing": list(r.missing) or RefitChecks.missing(r),
        "members": r.members(),
        "bootstrap_published": r.bootstrap is not None,
        "transfers": [
            {k: v for k, v in r.transfers[t].to_dict().items() if k != "done"}
            | {"done": [f"{role} slot {slot}" for role, slot in sorted(r.transfers[t].done)]}
            for t in sorted(r.transfers)
        ],
    }


class RefitsReads:
    """The refits as of one cycle (see the module docstring)."""

    __slots__ = ("_status", "_names")

    def __init__(self, status: dict[str, dict[str, Any]]) -> None:
        self._status = status
        self._names = sorted(status)

    def names(self) -> list[str]:
        return list(self._names)

    def exists(self, name: str) -> bool:
        return name in self._status

    def status(self, name: str) -> dict[str, Any] | None:
        got = self._status.get(name)
        return None if got is None else dict(got)


def read_model(
    refits: dict[str, Refit], previous: RefitsReads | None, moved: set[str]
) -> RefitsReads:
    """From scratch when ``previous`` is None, else ``previous`` with the refits of ``moved``
    rendered again."""
    if previous is None:
        return RefitsReads({name: refit_status(r) for name, r in refits.items()})
    if not moved:
        return previous
    out = rerendered(previous._status, refits, moved, refit_status)  # noqa: SLF001 - same module
    return RefitsReads(out)
