"""Which records retention may remove, and the ``--retain`` policy.

A record may go once it lies behind a kept snapshot (the compactor, ``coordinator/host/compaction.py``,
guarantees that part) and :func:`removable` says so. The rule is decided with the fold's own
output, not a copy of its logic: the compactor steps the real ``Coordinator`` over the record
and hands the effects here. Everything that decided something stays for the life of the log:
group_created, join, exit, death_reported, proposal and ack records by their kind; a links
report with down evidence by its payload; and any heartbeat-class record whose step produced an
effect (a tick that timed a rank out, a links report that made a rank HEALTHY, the record that
committed a view).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...eventlog.record import Record
from ..fold import registry
from ..fold.effects import Effect, Refused

#: Membership's kinds retention may remove: liveness and evidence that, once folded into a
#: snapshot, decided nothing on their own.
MEMBERSHIP_HEARTBEAT_CLASS = frozenset({"heartbeat", "tick", "links"})


def heartbeat_class() -> frozenset[str]:
    """The kinds retention may remove: membership's and the facets' ``compactable`` ones
    (``coordinator/fold/registry.py``; the epochs facet's ``progress``: a report whose step
    moved only a cursor is in the snapshot that lies before it)."""
    return MEMBERSHIP_HEARTBEAT_CLASS | registry.compactable()


def has_down_evidence(payload: Mapping[str, Any]) -> bool:
    """Whether a report says something is down: a non-empty ``down`` set, a peer marked
    ``"down"`` in ``peers``, a non-empty ``failed_ranks_hint``, or ``self_ready`` false.

    Both links encodings are understood (a ``peers`` map of every peer, or a ``down`` set of
    the peers now down), so a report is judged by what it says, not by its layout.
    """
    if payload.get("down"):
        return True
    peers = payload.get("peers")
    if isinstance(peers, Mapping) and "down" in peers.values():
        return True
    if payload.get("failed_ranks_hint"):
        return True
    return payload.get("self_ready") is False


def removable(record: Record, effects: Sequence[Effect]) -> bool:
    """Whether retention may remove ``record``, given the effects its fold step produced.

    Only a heartbeat-class record, carrying no down evidence, whose step changed nothing
    anyone was told about (no effect, or only its own refusal) may go. A refusal is allowed:
    a fenced heartbeat from a stale incarnation decided nothing.
    """
    if record.kind not in heartbeat_class():
        return False
    if has_down_evidence(record.payload):
        return False
    return all(type(effect) is Refused for effect in effects)


# -- the policy -------------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")


@dataclass(frozen=True)
class RetainPolicy:
    """What a compaction keeps of the heartbeat class: the last ``keep_records`` records of
    the log, or the records younger than ``keep_ns`` (by their ``ts``)."""

    keep_records: int | None = None
    keep_ns: int | None = None

    def describe(self) -> str:
        if self.keep_records is not None:
            return f"the last {self.keep_records:,} records"
        assert self.keep_ns is not None
        return f"the last {self.keep_ns / 1e9:g} s of records"


def parse_policy(text: str) -> RetainPolicy:
    """``1000000`` (records) or a duration: ``90s``, ``30m``, ``1h``, ``7d``. ValueError
    names what was wrong."""
    text = text.strip()
    if text.isdigit():
        return RetainPolicy(keep_records=int(text))
    m = _DURATION.match(text)
    if m is None:
        raise ValueError(
            f"retention policy {text!r} is neither a record count (1000000) nor a duration "
            "(90s, 30m, 1h, 7d)"
        )
    return RetainPolicy(keep_ns=round(float(m.group(1)) * _UNITS[m.group(2)] * 1_000_000_000))
