"""``python -m coordinator replay``: fold a log and check the stored projections.

The log is the source of truth; views, proposal outcomes and rank states are projections the
host wrote while it ran. Replay rebuilds them with a fresh fold and the same effect-to-row code
(:mod:`coordinator.fold.projections`) and compares, document by document. A view row must be
the row the fold derives (full or delta) or the full view (every row of a log from before delta
rows is one); stored views are read in full through :mod:`coordinator.host.views`. Any
difference is a *divergence*: a non-deterministic fold, a host that lost or invented a write,
or a damaged store. Replay never writes, and it may run beside a live coordinator: if the
projections move while it reads them, it starts over.

What is compared: the host writes rows together with a consumer offset P (atomically), so the
stored rows must equal the rows produced by the effects of records ``<= P``. Records after P
(the host was stopped before it projected them) are folded and reported, not compared; the host
projects them when it restarts. With ``until``, only the views committed up to that offset are
compared (later rows are the latest state, not history).

Where it starts: from offset 1 on a log nothing was removed from. On a compacted log (see
``coordinator/host/compaction.py``) a fold from offset 1 is impossible, so it starts from the oldest
kept snapshot the retained log needs (the first whole one at or after the last removed range
before the stop; a kept snapshot a newer step superseded is shrunk to a summary of what that
step verified), after verifying it: it decodes at its offset, its views and proposals equal the
stored rows, and every view committed before it equals what the compaction that removed
records there verified (a digest kept in the snapshot). Rows from before the start that the
fold cannot reproduce are covered by that check, not reported.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...eventlog import READ_PAGE, Log, Record, RemovedRange, open_log
from ..fold.effects import Effect, View, ViewCommitted
from ..fold.machine import Coordinator
from ..fold.projections import (
    DELTA_FROM,
    ViewRowError,
    is_delta,
    projection_kinds,
    proposal_doc,
    rows_for,
    view_doc,
)
from .snapshots import CONSUMER, decode_snapshot
from .views import every_view, get_view, read_views

Key = tuple[str, str, int]

#: Called with every record folded and its effects (the compactor's hook).
OnRecord = Callable[[Record, list[Effect], Coordinator], None]


class CompactedLog(ValueError):
    """The fold asked for needs records that retention removed; the message names them."""


@dataclass
class Start:
    """Where a fold begins: offset 0 (the whole log) or a kept snapshot, and what was checked."""

    offset: int = 0
    removed: list[RemovedRange] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)
    #: What the start's checks found wrong: divergences of the stored projections.
    problems: list[str] = field(default_factory=list)
    #: The views committed at or before ``offset``, from the store (verified, not folded).
    views: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "snapshot": self.offset or None,
            "removed_ranges": [[r.first, r.last, r.removed] for r in self.removed],
            "removed": sum(r.removed for r in self.removed),
            "verified": self.verified,
        }

    def describe(self) -> str:
        """One line for stderr: where the fold starts and why."""
        if not self.offset:
            return "replay: folding the whole log from offset 1 (nothing was removed from it)"
        n = sum(r.removed for r in self.removed)
        return (
            f"replay: the log is compacted ({n:,} records removed in {len(self.removed)} "
            f"range(s), up to offset {self.removed[-1].last if self.removed else 0}); starting "
            f"from the kept snapshot at offset {self.offset}, verified: " + "; ".join(self.verified)
        )


@dataclass
class ReplayReport:
    views: list[dict[str, Any]] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    folded: int = 0
    head: int = 0
    projected: int = 0
    until: int | None = None
    start: Start = field(default_factory=Start)

    @property
    def ok(self) -> bool:
        return not self.divergences

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "head": self.head,
            "start": self.start.as_json(),
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
    from_start: bool = False,
    on_record: Callable[[], OnRecord] | None = None,
) -> ReplayReport:
    """Fold ``target``'s log (to ``until``) and compare with its projections; see the module
    docstring for where the fold starts. ``from_start`` insists on offset 1 and raises
    CompactedLog on a log that records were removed from. ``on_record`` (see
    :func:`replay_log`) sees every record folded and what the fold did with it."""
    log = await open_log(target, read_only=True)
    try:
        return await replay_log(
            log,
            until=until,
            group=group,
            progress=progress,
            from_start=from_start,
            on_record=on_record,
        )
    finally:
        await log.close()


#: How often replay starts over when a live coordinator wrote projections while it read them.
ATTEMPTS = 3


async def replay_log(
    log: Log,
    *,
    until: int | None = None,
    group: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    from_start: bool = False,
    on_record: Callable[[], OnRecord] | None = None,
) -> ReplayReport:
    """Replay once; if the stored projections moved meanwhile (a running coordinator wrote
    more), the comparison mixed two moments, so start over, a few times at most.
    ``on_record`` makes a fresh hook for each attempt."""
    for _ in range(ATTEMPTS):
        report = await _replay_once(
            log,
            until=until,
            group=group,
            progress=progress,
            from_start=from_start,
            on_record=None if on_record is None else on_record(),
        )
        if report.ok or await log.get_consumer_offset(CONSUMER) == report.projected:
            return report
    return report


async def read_pages(log: Log, position: int, stop: int) -> AsyncIterator[list[Record]]:
    """The records of ``log`` after ``position`` up to ``stop``, a page at a time."""
    while position < stop:
        page = await log.read(position, READ_PAGE, until=stop)
        if not page:
            return
        yield page
        position = page[-1].offset


async def find_start(
    log: Log, stop: int, *, from_start: bool = False
) -> tuple[Start, Coordinator, bytes | None]:
    """The oldest kept snapshot a fold to ``stop`` needs (or offset 0 when no record up to
    ``stop`` was removed), verified against the stored projections: ``(start, the fold
    restored from it, its bytes)``. CompactedLog when no fold to ``stop`` is possible."""
    removed = await log.removed_ranges(0, stop)
    if not removed:
        return Start(), Coordinator(), None
    ranges = ", ".join(f"{r.first}-{r.last} ({r.removed:,} removed)" for r in removed[:10])
    if from_start:
        raise CompactedLog(
            f"records were removed from this log by compaction ({ranges}"
            f"{', ...' if len(removed) > 10 else ''}), so it cannot be folded from offset 1; "
            "replay without --from-start starts from the kept snapshot they lie behind"
        )
    need = removed[-1].last
    offset, data = 0, None
    for kept in await log.kept_snapshots(CONSUMER):
        if kept < need:
            continue
        data = await log.load_kept_snapshot(CONSUMER, kept)
        if data is not None and not is_summary(data):
            offset = kept
            break
    if not offset or offset > stop:
        at = f"; the earliest offset a replay can stop at is {offset}" if offset else ""
        raise CompactedLog(
            f"records up to offset {need} were removed by compaction ({ranges}); a fold to "
            f"offset {stop} needs a whole kept snapshot from offset {need} to {stop} and there "
            f"is none{at}"
        )
    assert data is not None
    start = Start(offset=offset, removed=await log.removed_ranges(0, offset))
    machine = await _verify_start(log, start, data)
    return start, machine, data


async def _verify_start(log: Log, start: Start, data: bytes) -> Coordinator:
    """Check a kept snapshot before folding from it; a failed check is a CompactedLog."""
    offset = start.offset
    try:
        machine, _ = decode_snapshot(data)
    except Exception as exc:
        raise CompactedLog(
            f"the kept snapshot at offset {offset} cannot be read ({exc}); the records removed "
            "behind it make a fold from an earlier point impossible"
        ) from None
    if machine.offset != offset:
        raise CompactedLog(
            f"the kept snapshot stored at offset {offset} holds the fold at offset {machine.offset}"
        )
    start.verified.append(f"it decodes and holds the fold at offset {offset}")
    problems: list[str] = []
    for g in machine.groups():
        view = machine.current_view(g)
        if view is None:
            continue
        try:
            stored = await get_view(log, g, view.version)
            later = await read_views(log, g, after_version=view.version, limit=1)
        except ViewRowError as exc:
            problems.append(str(exc))
            continue
        if stored is None or stored != view_doc(view):
            problems.append(
                f"view {g}/{view.version}: the snapshot's current view is not the stored one"
            )
        if later and later[0].doc.get("offset", 0) <= offset:
            problems.append(
                f"view {g}/{later[0].version}: committed at offset "
                f"{later[0].doc.get('offset')}, before the snapshot at {offset}, which knows "
                f"only version {view.version}"
            )
    if not problems:
        start.verified.append("its current views equal the stored ones")
    try:
        start.views, checked, wrong = await _check_digests(log, offset, machine.groups())
    except ViewRowError as exc:
        start.views, checked, wrong = [], 0, [f"the stored views do not fold: {exc}"]
    if not wrong:
        start.verified.append(
            f"the {len(start.views)} views committed up to it equal what compaction verified "
            f"({checked} compaction step(s))"
        )
    start.problems = problems + wrong
    return machine


def summary(offset: int, compaction: dict[str, Any] | None) -> bytes:
    """What a kept snapshot becomes once a newer one supersedes it: what its compaction step
    verified (the views digest), without the state."""
    return msgspec.json.encode({"summary": True, "offset": offset, "compaction": compaction})


def is_summary(data: bytes) -> bool:
    return msgspec.json.decode(data).get("summary") is True


def compaction_meta(data: bytes) -> dict[str, Any] | None:
    """What the compaction step that kept a snapshot (whole or summary) verified."""
    return msgspec.json.decode(data).get("compaction")


def views_digest(docs: Iterable[dict[str, Any]]) -> str:
    """SHA-256 over the views' canonical documents in (group, version) order."""
    h = hashlib.sha256()
    for doc in sorted(docs, key=lambda d: (d["group"], d["version"])):
        h.update(_canonical.encode(doc))
        h.update(b"\n")
    return h.hexdigest()


_canonical = msgspec.json.Encoder(order="sorted")


async def _check_digests(
    log: Log, offset: int, groups: list[str]
) -> tuple[list[dict[str, Any]], int, list[str]]:
    """Every view of ``groups`` committed at or before ``offset`` (by commit offset), checked
    against the digests the compaction steps recorded in their kept snapshots: ``(the views,
    how many steps were checked, what differs)``."""
    views = [d for d in await stored_views(log, groups) if d["offset"] <= offset]
    checked = 0
    wrong: list[str] = []
    for kept in await log.kept_snapshots(CONSUMER):
        if kept > offset:
            break
        data = await log.load_kept_snapshot(CONSUMER, kept)
        meta = compaction_meta(data) if data else None
        if meta is None:
            continue
        after = meta["after"]
        span = [d for d in views if after < d["offset"] <= kept]
        if len(span) != meta["views"] or views_digest(span) != meta["views_sha256"]:
            names = ", ".join(f"{d['group']}/{d['version']}" for d in span[:20])
            wrong.append(
                f"views committed in offsets {after + 1}-{kept} ({names or 'none'}): the store "
                f"holds {len(span)} that are not the {meta['views']} the compaction step "
                f"ending at {kept} verified"
            )
        checked += 1
    views.sort(key=lambda d: (d["offset"], d["group"]))
    return views, checked, wrong


async def stored_views(log: Log, groups: Iterable[str]) -> list[dict[str, Any]]:
    """Every stored view of ``groups``, in full (ViewRowError when the rows do not fold)."""
    out: list[dict[str, Any]] = []
    for g in groups:
        out.extend([stored.doc async for stored in every_view(log, g)])
    return out


async def _replay_once(
    log: Log,
    *,
    until: int | None,
    group: str | None,
    progress: Callable[[int, int], None] | None,
    from_start: bool,
    on_record: OnRecord | None,
) -> ReplayReport:
    report = ReplayReport(until=until)
    report.head = await log.head()
    report.projected = await log.get_consumer_offset(CONSUMER)
    stop = report.head if until is None else min(until, report.head)
    start, machine, _ = await find_start(log, stop, from_start=from_start)
    report.start = start
    # the rows the fold derives; a view's None: only its meaning is known (a start's current
    # view, whose row may be a delta from a version before the start)
    expected: dict[Key, dict[str, Any] | None] = {}
    views: dict[Key, View] = {}
    if start.offset:
        report.views = [v for v in start.views if group in (None, v["group"])]
        for g in machine.groups():
            view = machine.current_view(g)
            if view is not None:
                expected[("view", g, view.version)] = None
                views[("view", g, view.version)] = view
        for p in _proposals(machine):
            expected[("proposal", p["group"], p["id"])] = p
    position = start.offset
    async for page in read_pages(log, position, stop):
        for rec in page:
            effects = machine.step(rec)
            if on_record is not None:
                on_record(rec, effects, machine)
            for effect in effects:
                if isinstance(effect, ViewCommitted) and group in (None, effect.view.group):
                    report.views.append(view_doc(effect.view))
                if effect.offset <= report.projected:
                    for row in rows_for(effect):
                        expected[(row.kind, row.group, row.seq)] = row.doc
                    if isinstance(effect, ViewCommitted):
                        views[("view", effect.view.group, effect.view.version)] = effect.view
        position = page[-1].offset
        if progress is not None:
            progress(position, stop)
    report.folded = max(position, start.offset)
    groups = sorted({g for _, g, _ in expected} | set(machine.groups()))
    if group is not None:
        groups = [g for g in groups if g == group]
    stored, full, unfolded = await _stored(
        log, groups, ["view"] if until is not None else list(projection_kinds())
    )
    if until is not None:
        stored = {k: d for k, d in stored.items() if d.get("offset", 0) <= until}
        expected = {k: d for k, d in expected.items() if k[0] == "view"}
    expected = {k: d for k, d in expected.items() if k[1] in groups}
    if start.offset:
        # rows written before the start that the fold cannot reproduce are covered by the
        # start's verification (views) or were the latest state then; only later ones count
        stored = {
            k: d for k, d in stored.items() if k in expected or _row_offset(k, d) > start.offset
        }
    report.divergences = start.problems + unfolded + _compare(expected, stored, views, full)
    return report


def _proposals(machine: Coordinator) -> list[dict[str, Any]]:
    out = []
    for item in machine.snapshot()["proposals"]:
        proposal = machine.proposal(item["id"])
        if proposal is not None:
            out.append(proposal_doc(proposal))
    return out


def _row_offset(key: Key, doc: dict[str, Any]) -> int:
    """The offset of the record that produced a stored row (a proposal's id is its offset)."""
    if key[0] == "proposal":
        return int(doc.get("id", key[2]))
    return int(doc.get("offset", 0))


async def _stored(
    log: Log, groups: list[str], kinds: list[str]
) -> tuple[dict[Key, dict[str, Any]], dict[Key, dict[str, Any]], list[str]]:
    """The stored rows of ``groups`` as they are, the views they mean in full, and what does
    not fold (a group's view rows that do not: every row is still compared as stored)."""
    out: dict[Key, dict[str, Any]] = {}
    full: dict[Key, dict[str, Any]] = {}
    unfolded: list[str] = []
    for kind in kinds:
        for g in groups:
            if kind == "view":
                try:
                    async for view in every_view(log, g):
                        out[("view", g, view.version)] = view.row.doc
                        full[("view", g, view.version)] = view.doc
                    continue
                except ViewRowError as exc:
                    unfolded.append(f"the view rows of {g} do not fold: {exc}")
            after = 0
            while True:
                rows = await log.read_projections(kind, g, after_seq=after, limit=1000)
                for row in rows:
                    out[(row.kind, row.group, row.seq)] = row.doc
                if len(rows) < 1000:
                    break
                after = rows[-1].seq
            # after_seq is exclusive, and seq 0 is a real row of many kinds (a group's, rank
            # 0's state, epoch 0, a refit's definition, a facet's one row per group)
            row0 = await log.get_projection(kind, g, 0)
            if row0 is not None:
                out[(kind, g, 0)] = row0.doc
    return out, full, unfolded


def _compare(
    expected: dict[Key, dict[str, Any] | None],
    stored: dict[Key, dict[str, Any]],
    views: dict[Key, View],
    full: dict[Key, dict[str, Any]],
) -> list[str]:
    problems: list[str] = []
    for key in sorted(set(expected) | set(stored)):
        kind, g, seq = key
        name = f"{kind} {g}/{seq}"
        if key not in stored:
            problems.append(f"{name}: replay produces it but the store has no such row")
        elif key not in expected:
            problems.append(f"{name}: the store has it but replay does not produce it")
        elif kind == "view":
            problem = _compare_view(stored[key], full.get(key), expected[key], views[key])
            if problem is not None:
                problems.append(f"{name} {problem}")
        elif not _same_row(kind, stored[key], expected[key]):
            problems.append(f"{name} differs: {_diffs(stored[key], expected[key])}")
    return problems


#: The fields added to projection rows since logs were first written, by kind (a path into the
#: document): a stored row without one is the row an earlier version of foldplane wrote for the
#: same records, and replay accepts it; any other difference is a divergence.
ADDED_FIELDS: dict[str, tuple[tuple[str, ...], ...]] = {
    "group": (("config", "checkpoint_rank"),),
    "view": (("checkpoint_rank",),),
    "shutdown": (("checkpoint_rank",),),
}


def _same_row(kind: str, row: dict[str, Any], expected: dict[str, Any]) -> bool:
    """Whether a stored row is the one replay derives, or that row as an earlier version
    wrote it: without a field of :data:`ADDED_FIELDS`; or, for the shutdown of a run the
    operator ended, naming no checkpoint rank (ended runs name one since)."""
    if row == expected:
        return True
    for path in ADDED_FIELDS.get(kind, ()):
        if not _holds(row, path):
            expected = _without(expected, path)
    ended = kind == "shutdown" and expected.get("reason") == "ended"
    if ended and "checkpoint_rank" in row and row["checkpoint_rank"] is None:
        expected = {**expected, "checkpoint_rank": None}
    return row == expected


def _holds(doc: dict[str, Any], path: tuple[str, ...]) -> bool:
    for name in path:
        if not isinstance(doc, dict) or name not in doc:
            return False
        doc = doc[name]
    return True


def _without(doc: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    """``doc`` without the field at ``path`` (a copy; ``doc`` as it is if it has none)."""
    head, *rest = path
    if head not in doc:
        return doc
    if not rest:
        return {k: v for k, v in doc.items() if k != head}
    inner = doc[head]
    if not isinstance(inner, dict):
        return doc
    return {**doc, head: _without(inner, tuple(rest))}


def _compare_view(
    row: dict[str, Any],
    meant: dict[str, Any] | None,
    expected: dict[str, Any] | None,
    view: View,
) -> str | None:
    """What is wrong with a stored view row (None: nothing). ``meant`` is the full view the
    stored rows fold to (None where they do not), ``expected`` the row replay derives (None
    where only ``view`` is known). A row must be the one replay derives, or the full view: a
    full row is always a faithful encoding (every row of a log from before delta rows is one)."""
    if expected is not None and _same_row("view", row, expected):
        return None
    if not is_delta(row):
        want = view_doc(view)
        return None if _same_row("view", row, want) else f"differs: {_diffs(row, want)}"
    if expected is None:
        if meant is None:
            return "is a delta that does not fold"
        want = view_doc(view)
        return None if _same_row("view", meant, want) else f"differs: {_diffs(meant, want)}"
    if not is_delta(expected):
        return (
            f"is stored as a delta from version {row.get(DELTA_FROM)!r} where replay derives "
            "a full row"
        )
    return f"differs: {_diffs(row, expected)}"


def _diffs(a: dict[str, Any], b: dict[str, Any]) -> str:
    fields = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return "; ".join(f"{f}: stored {a.get(f)!r}, replayed {b.get(f)!r}" for f in fields)
