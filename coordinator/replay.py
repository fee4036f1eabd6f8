"""``python -m coordinator replay``: fold a log from scratch and check the stored projections.

The log is the source of truth; views, proposal outcomes and rank states are projections the
host wrote while it ran. Replay rebuilds them with a fresh fold and the same effect-to-row code
(:mod:`coordinator.projections`) and compares, document by document. Any difference is a
*divergence*: a non-deterministic fold, a host that lost or invented a write, or a damaged
store. Replay never writes, and it may run beside a live coordinator: if the projections move while
it reads them, it starts over.

What is compared: the host writes rows together with a consumer offset P (atomically), so the
stored rows must equal the rows produced by the effects of records ``<= P``. Records after P
(the host was stopped before it projected them) are folded and reported, not compared; the host
projects them when it restarts. With ``until``, only the views committed up to that offset are
compared (later rows are the latest state, not history).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from coordinator.effects import ViewCommitted
from coordinator.host import CONSUMER
from coordinator.machine import Coordinator
from coordinator.projections import PROJECTION_KINDS, rows_for, view_doc
from eventlog import READ_PAGE, Log, open_log

Key = tuple[str, str, int]


@dataclass
class ReplayReport:
    views: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    folded: int = 0
    head: int = 0
    projected: int = 0
    until: int | None = None

    @property
    def ok(self) -> bool:
        return not self.divergences

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "head": self.head,
            "folded_to": self.folded,
            "projected_to": self.projected,
            "until": self.until,
            "views": self.views,
            "divergences": self.divergences,
        }


async def replay(
    target: str,
    *,
    until: int | None = None,
    group: str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> ReplayReport:
    """Fold ``target``'s log from offset 1 (to ``until``) and compare with its projections."""
    log = await open_log(target)
    try:
        return await _replay(log, until=until, group=group, progress=progress)
    finally:
        await log.close()


#: How often replay starts over when a live coordinator wrote projections while it read them.
ATTEMPTS = 3


async def _replay(
    log: Log,
    *,
    until: int | None,
    group: str | None,
    progress: Callable[[int, int], None] | None,
) -> ReplayReport:
    """Replay once; if the stored projections moved meanwhile (a running coordinator wrote
    more), the comparison mixed two moments, so start over, a few times at most."""
    for _ in range(ATTEMPTS):
        report = await _replay_once(log, until=until, group=group, progress=progress)
        if report.ok or await log.get_consumer_offset(CONSUMER) == report.projected:
            return report
    return report


async def _replay_once(
    log: Log,
    *,
    until: int | None,
    group: str | None,
    progress: Callable[[int, int], None] | None,
) -> ReplayReport:
    report = ReplayReport(until=until)
    report.head = await log.head()
    report.projected = await log.get_consumer_offset(CONSUMER)
    stop = report.head if until is None else min(until, report.head)
    machine = Coordinator()
    expected: dict[Key, dict[str, Any]] = {}
    position = 0
    while position < stop:
        page = await log.read(position, READ_PAGE, until=stop)
        if not page:
            break
        for rec in page:
            for effect in machine.step(rec):
                if isinstance(effect, ViewCommitted) and group in (None, effect.view.group):
                    report.views.append(view_doc(effect.view))
                if effect.offset <= report.projected:
                    for row in rows_for(effect):
                        expected[(row.kind, row.group, row.seq)] = row.doc
        position = page[-1].offset
        if progress is not None:
            progress(position, stop)
    report.folded = position
    groups = sorted({g for _, g, _ in expected} | set(machine.groups()))
    if group is not None:
        groups = [g for g in groups if g == group]
    stored = await _stored(log, groups, ["view"] if until is not None else list(PROJECTION_KINDS))
    if until is not None:
        stored = {k: d for k, d in stored.items() if d.get("offset", 0) <= until}
        expected = {k: d for k, d in expected.items() if k[0] == "view"}
    expected = {k: d for k, d in expected.items() if k[1] in groups}
    report.divergences = _compare(expected, stored)
    return report


async def _stored(log: Log, groups: list[str], kinds: list[str]) -> dict[Key, dict[str, Any]]:
    out: dict[Key, dict[str, Any]] = {}
    for kind in kinds:
        for g in groups:
            after = 0
            while True:
                rows = await log.read_projections(kind, g, after_seq=after, limit=1000)
                for row in rows:
                    out[(row.kind, row.group, row.seq)] = row.doc
                if len(rows) < 1000:
                    break
                after = rows[-1].seq
            if kind in ("group", "failure", "rank_state"):
                # seq 0 is a real row for these kinds, and after_seq is exclusive
                row0 = await log.get_projection(kind, g, 0)
                if row0 is not None:
                    out[(kind, g, 0)] = row0.doc
    return out


def _compare(expected: dict[Key, dict[str, Any]], stored: dict[Key, dict[str, Any]]) -> list[str]:
    problems: list[str] = []
    for key in sorted(set(expected) | set(stored)):
        kind, g, seq = key
        name = f"{kind} {g}/{seq}"
        if key not in stored:
            problems.append(f"{name}: replay produces it but the store has no such row")
        elif key not in expected:
            problems.append(f"{name}: the store has it but replay does not produce it")
        elif stored[key] != expected[key]:
            a, b = stored[key], expected[key]
            fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            diffs = "; ".join(f"{f}: stored {a.get(f)!r}, replayed {b.get(f)!r}" for f in fields)
            problems.append(f"{name} differs: {diffs}")
    return problems
