"""A rank's story: the chain of records that brought it to its state and its place in or out of
``active_ranks``, each with its offset, time and the fold's own reason.

The story is not reconstructed by rules of its own: it folds the log from offset 1 with the
fold itself (:class:`coordinator.fold.machine.Coordinator`) and reads what the fold did, record by
record: the effects it produced (``RankState.reason``, ``View.cause``, ``Proposal.reason``,
``Refused.message``) and, for evidence that leaves no effect of its own (a heartbeat, a links
report), the fold's state for that rank just before and just after the step. So the story is as
deterministic as replay, and ``GET /groups/{group}/ranks/{rank}/story`` and ``python -m
coordinator explain`` print the same one: both call :func:`story_of`.

Memory stays bounded on a long log: every *decision* about the rank is kept (its state changes,
the view changes and proposals that concern it, the group's shutdown), but *evidence* (heartbeats,
links reports, ACKs, fenced inputs) is kept only as the last :data:`EVIDENCE_LIMIT` items before
each decision, and heartbeats only as the last one before the rank went OFFLINE. What was left
out is counted in ``omitted``.

Entry shape (plain JSON): ``{"offset", "ts", "record", "event", "reason", ...}`` where
``record`` is the kind of the log record that was folded and ``event`` what the story saw:
``group_created``, ``rank_state``, ``heartbeat``, ``links``, ``down_report``, ``up_report``,
``ack``, ``refused``, ``proposal``, ``proposal_resolved``, ``view_prepare``,
``view_committed``, ``group_failed``, ``shutdown_with_save``; what each facet tells of the
rank (its ``RankStoryPart``, ``coordinator.host.facets``: the rank's part of an epoch, the
refits over its group, with the events their modules list); and on a compacted log, first,
``kept_snapshot``: the story starts from the kept snapshot the removed records lie behind.
"""

from __future__ import annotations

import datetime as dt
from collections import deque
from collections.abc import Awaitable, Callable, Container, Iterable
from typing import Any, Protocol, TypeVar

from ...eventlog import Log, Record, open_log
from ...wire import ranks as rank_sets
from ...wire.codes import COMPACTED, RANK_OUT_OF_RANGE, UNKNOWN_GROUP
from ...wire.protocol import links_down
from ...wire.ranks import RankSetError
from ..fold.effects import (
    OFFLINE,
    GroupCreated,
    GroupFailed,
    ProposalAccepted,
    ProposalResolved,
    RankState,
    Refused,
    ShutdownWithSave,
    ViewCommitted,
    ViewPrepare,
)
from ..fold.machine import Coordinator
from ..fold.reasons import ranks_text
from ..fold.state import GroupState
from .facets import facet_hosts
from .replay import CompactedLog, find_start, read_pages

#: Evidence items (links reports, ACKs, fenced inputs) kept before each decision.
EVIDENCE_LIMIT = 32

T = TypeVar("T")


class StoryError(Exception):
    """The story cannot be told: no such group in the log (up to the offset asked), or a rank
    outside it; a facet's story raises its own kind of it. ``code`` is the wire error code."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


# -- the two places that read a record's payload ------------------------------------------------


def _beat_ranks(record: Record) -> Container[int]:
    """The ranks a heartbeat record speaks for. One heartbeat per record (older logs) carries
    its rank in ``record.rank``; a shared record (``rank`` null) names its ranks as a rank
    set (``wire.ranks``). The fold has already accepted the record, so it decodes."""
    if record.rank is not None:
        return (record.rank,)
    try:
        return frozenset(rank_sets.decode(record.payload.get("ranks", []), 1 << 16))
    except RankSetError:
        return ()


def _named_down(record: Record, world_size: int) -> Container[int]:
    """The ranks a (protocol 2) links record names down or hinted, counted by the fold or not."""
    try:
        return links_down(record.payload, world_size)
    except RankSetError:
        return ()


def _hinted_ranks(record: Record) -> Container[int]:
    """The ranks a links record names in its failure hint (down evidence that came from a
    failed collective rather than a link probe): ``hint`` (a rank set), or in older logs
    ``failed_ranks_hint`` (a list)."""
    legacy = record.payload.get("failed_ranks_hint")
    if isinstance(legacy, list):
        return frozenset(legacy)
    try:
        return frozenset(rank_sets.decode(record.payload.get("hint", []), 1 << 16))
    except RankSetError:
        return ()


def _group_state(machine: Coordinator, group: str) -> GroupState | None:
    """The fold's state of ``group``. The story reads it (never writes it) between steps to see
    what a step did to one rank when the step leaves no effect to say so."""
    return machine._groups.get(group)  # noqa: SLF001 - same package, read-only


# -- the builder ---------------------------------------------------------------------------------


class StoryBuilder:
    """Folds records one at a time and keeps what concerns ``(group, rank)``."""

    def __init__(
        self,
        group: str,
        rank: int,
        *,
        evidence_limit: int = EVIDENCE_LIMIT,
        machine: Coordinator | None = None,
    ) -> None:
        self.group = group
        self.rank = rank
        #: the fold, from scratch or restored from a kept snapshot of a compacted log
        self.machine = machine or Coordinator()
        self.entries: list[dict[str, Any]] = []
        self._evidence: deque[dict[str, Any]] = deque(maxlen=evidence_limit)
        self._last_beat: dict[str, Any] | None = None
        self._beats_since = 0
        self.heartbeats = 0
        self.omitted = {"heartbeats": 0, "evidence": 0}
        self.state_since: dict[str, Any] | None = None
        self.membership_since: dict[str, Any] | None = None
        #: the facets' parts of the story (``coordinator.host.facets.RankStoryPart``)
        self.parts = [h.story(group, rank) for h in facet_hosts() if h.story is not None]

    # .. stepping

    def feed(self, records: Iterable[Record]) -> None:
        for record in records:
            self.step(record)

    def step(self, record: Record) -> None:
        group, rank = self.group, self.rank
        g = _group_state(self.machine, group)
        concerns_group = record.group == group or record.group is None
        before = None
        was_active = False
        concerned = g is not None and concerns_group and rank < len(g.ranks)
        for part in self.parts:
            part.before(self.machine, concerned)
        if g is not None and concerned:
            reporter = record.rank if record.kind == "links" and record.group == group else None
            if reporter is not None and not 0 <= reporter < len(g.ranks):
                reporter = None
            before = (
                g.ranks[rank].down,
                g.ranks[rank].self_ready,
                reporter is not None and rank in g.ranks[reporter].down,
            )
            was_active = rank in g.active
        effects = self.machine.step(record)
        for part in self.parts:
            decisions, evidence = part.stepped(record, effects, self.machine)
            for event, reason, fields in evidence:
                self._evidence_entry(record, event, reason, **fields)
            for event, reason, fields in decisions:
                self._decision(_entry(record, event, reason, **fields))
        if not concerns_group:
            return
        g = _group_state(self.machine, group)
        if g is None or rank >= len(g.ranks):
            return
        if record.kind == "heartbeat":
            if rank in _beat_ranks(record) and rank in g.alive and not _refused(effects, rank):
                self._beat(record)
        elif record.kind == "links" and before is not None:
            self._links(record, g, before)
        elif record.kind == "ack" and record.rank == rank and not _refused(effects, rank):
            version = record.payload.get("version")
            self._evidence_entry(record, "ack", f"ACKed version {version}", version=version)
        active = rank in g.active
        for effect in effects:
            self._effect(record, effect, was_active)
            if getattr(effect, "group", None) == group:
                for part in self.parts:
                    told = part.effect(
                        record, effect, self.machine, was_active=was_active, active=active
                    )
                    if told is not None:
                        event, reason, extra = told
                        self._decision(_entry(record, event, reason, **extra))

    def _beat(self, record: Record) -> None:
        self.heartbeats += 1
        self._beats_since += 1
        self._last_beat = _entry(record, "heartbeat", "a heartbeat: a sign of life")

    def _links(self, record: Record, g: GroupState, before: tuple[Any, ...]) -> None:
        rank = self.rank
        info = g.ranks[rank]
        reporter = record.rank
        if reporter == rank:
            down, ready, _ = before
            if (info.down, info.self_ready) != (down, ready):
                says = f"peers {ranks_text(info.down)} down" if info.down else "every peer up"
                self._evidence_entry(
                    record,
                    "links",
                    f"its links report: {says}; self_ready {str(info.self_ready).lower()}",
                    down=sorted(info.down),
                    self_ready=info.self_ready,
                )
            return
        if reporter is None or reporter >= len(g.ranks):
            return
        was, now = before[2], rank in g.ranks[reporter].down
        about = record.payload.get("version")
        stale = isinstance(about, int) and about <= info.joined_version
        if not now and stale and rank in _named_down(record, len(g.ranks)):
            self._evidence_entry(
                record,
                "down_report_not_counted",
                f"rank {reporter} reports rank {rank} down on view {about}; not counted: rank "
                f"{rank}'s incarnation joined when view {info.joined_version} was committed, "
                "so that view ran with the process it replaced",
                reporter=reporter,
            )
        if was == now:
            return
        if now:
            source = "failed_ranks_hint" if rank in _hinted_ranks(record) else "a link probe"
            self._evidence_entry(
                record,
                "down_report",
                f"rank {reporter} reports rank {rank} down ({source})",
                reporter=reporter,
            )
        else:
            self._evidence_entry(
                record,
                "up_report",
                f"rank {reporter} no longer reports rank {rank} down",
                reporter=reporter,
            )

    def _effect(self, record: Record, effect: Any, was_active: bool) -> None:
        rank = self.rank
        if isinstance(effect, RankState):
            if effect.group == self.group and effect.rank == rank:
                entry = _entry(
                    record,
                    "rank_state",
                    effect.reason,
                    state=effect.state,
                    incarnation=effect.incarnation,
                    rank_epoch=effect.rank_epoch,
                )
                self._decision(entry, heartbeat=effect.state == OFFLINE)
                self.state_since = entry
        elif isinstance(effect, ViewCommitted):
            view = effect.view
            if view.group != self.group:
                return
            active = rank in view.active_ranks
            was = self.membership_since is not None and self.membership_since["active"]
            dropped = rank in view.dropped_ranks
            if active != was or dropped or self.membership_since is None:
                entry = _entry(
                    record,
                    "view_committed",
                    _view_reason(view.version, active, view.cause),
                    version=view.version,
                    active=active,
                    cause=view.cause["kind"],
                    proposals=list(view.cause.get("proposals", [])),
                    dropped=dropped,
                    active_ranks=len(view.active_ranks),
                )
                self._decision(entry)
                self.membership_since = entry
        elif isinstance(effect, ViewPrepare):
            if effect.group != self.group:
                return
            if (rank in effect.active_ranks) != was_active:
                verb = "to add it to" if not was_active else "to remove it from"
                self._decision(
                    _entry(
                        record,
                        "view_prepare",
                        f"version {effect.version} prepared {verb} active_ranks "
                        f"({effect.cause['kind']}: {effect.cause['detail']})",
                        version=effect.version,
                        active=rank in effect.active_ranks,
                        cause=effect.cause["kind"],
                        participant=rank in effect.participants,
                    )
                )
        elif isinstance(effect, ProposalAccepted | ProposalResolved):
            p = effect.proposal
            if p.group != self.group or rank not in p.ranks:
                return
            accepted = isinstance(effect, ProposalAccepted)
            extra: dict[str, Any] = {}
            if p.op == "reconfigure":
                # torch's reconfigure: each member's call is a record (docs/reconfigure.md)
                what = (
                    f"proposal {p.id}: reconfigure uuid {p.uuid} to members {list(p.ranks)} "
                    f"(in that order)"
                )
                queued = f"{what} called by rank {p.callers[-1]}" + (
                    "" if len(p.callers) == 1 else f" (called so far: {list(p.callers)})"
                )
                extra = {"uuid": p.uuid, "callers": list(p.callers)}
            else:
                what = (
                    f"proposal {p.id}: {p.op} {ranks_text(p.ranks)} by {p.proposer or 'operator'}"
                )
                queued = f"{what} queued"
            self._decision(
                _entry(
                    record,
                    "proposal" if accepted else "proposal_resolved",
                    queued if accepted else f"{what} {p.status}: {p.reason}",
                    proposal=p.id,
                    op=p.op,
                    status=p.status,
                    version=p.version,
                    **extra,
                )
            )
        elif isinstance(effect, Refused):
            if effect.group == self.group and effect.rank == rank:
                self._evidence_entry(
                    record,
                    "refused",
                    f"{effect.kind} refused ({effect.code}): {effect.message}",
                    code=effect.code,
                )
        elif isinstance(effect, GroupCreated):
            if effect.group == self.group:
                self._decision(
                    _entry(
                        record,
                        "group_created",
                        f"group {effect.group!r} created with world_size "
                        f"{effect.config.world_size}",
                    )
                )
        elif isinstance(effect, GroupFailed):
            if effect.group == self.group:
                self._decision(_entry(record, "group_failed", effect.reason))
        elif isinstance(effect, ShutdownWithSave) and effect.group == self.group:
            self._decision(
                _entry(
                    record,
                    "shutdown_with_save",
                    f"{effect.reason}: {effect.detail}",
                    code=effect.reason,
                )
            )

    # .. keeping entries

    def _evidence_entry(self, record: Record, event: str, reason: str, **extra: Any) -> None:
        if len(self._evidence) == self._evidence.maxlen:
            self.omitted["evidence"] += 1
        self._evidence.append(_entry(record, event, reason, **extra))

    def _decision(self, entry: dict[str, Any], *, heartbeat: bool = False) -> None:
        """A decision keeps the evidence gathered since the previous one, and, when the rank
        went OFFLINE, the last heartbeat before it (what a timeout is measured from)."""
        pending = list(self._evidence)
        self._evidence.clear()
        if heartbeat and self._last_beat is not None:
            beat = self._last_beat
            beat["reason"] = (
                f"the last heartbeat before it went OFFLINE ({self._beats_since} since the "
                "previous entry)"
            )
            pending.append(beat)
            self._last_beat = None
            self._beats_since = 0
        pending.sort(key=lambda e: e["offset"])
        self.entries.extend(pending)
        self.entries.append(entry)

    # .. the result

    def result(self) -> dict[str, Any]:
        """The story as plain JSON data (see the module docstring)."""
        g = _group_state(self.machine, self.group)
        if g is None:
            raise StoryError(
                UNKNOWN_GROUP,
                f"no group {self.group!r} in the log up to offset {self.machine.offset}",
            )
        if not 0 <= self.rank < len(g.ranks):
            raise StoryError(
                RANK_OUT_OF_RANGE,
                f"rank {self.rank} is not in 0..{len(g.ranks) - 1} of group {self.group!r}",
            )
        entries = list(self.entries)
        trailing = list(self._evidence)
        if self._last_beat is not None:
            beat = dict(self._last_beat)
            beat["reason"] = f"the latest heartbeat ({self._beats_since} since the previous entry)"
            trailing.append(beat)
        entries.extend(sorted(trailing, key=lambda e: e["offset"]))
        info = g.ranks[self.rank]
        active = self.rank in g.active
        omitted = dict(self.omitted)
        omitted["heartbeats"] = max(
            0, self.heartbeats - sum(e["event"] == "heartbeat" for e in entries)
        )
        return {
            "group": self.group,
            "rank": self.rank,
            "until": self.machine.offset,
            "state": info.state,
            "incarnation": info.incarnation,
            "rank_epoch": info.rank_epoch,
            "exited": info.exited,
            "active": active,
            "version": g.version,
            "heartbeats": self.heartbeats,
            "state_since": None if self.state_since is None else self.state_since["offset"],
            "membership_since": None
            if self.membership_since is None
            else self.membership_since["offset"],
            "summary": self._summary(info.state, active, g.version),
            "entries": entries,
            "omitted": omitted,
        }

    def _summary(self, state: str, active: bool, version: int) -> str:
        place = "in" if active else "outside"
        text = f"rank {self.rank} of {self.group!r} is {state}"
        text += f", {place} active_ranks of version {version}" if version else " (not formed yet)"
        if self.state_since is not None:
            s = self.state_since
            text += f"; {state} since offset {s['offset']}: {s['reason']}"
        if self.membership_since is not None and version:
            m = self.membership_since
            text += f"; {place} since version {m['version']} (offset {m['offset']}, {m['cause']})"
        for facet in self.parts:
            part = facet.summary(self.machine)
            if part is not None:
                text += f"; {part}"
        return text


def _entry(record: Record, event: str, reason: str, **extra: Any) -> dict[str, Any]:
    return {
        "offset": record.offset,
        "ts": record.ts,
        "record": record.kind,
        "event": event,
        "reason": reason,
        **extra,
    }


def _refused(effects: list[Any], rank: int) -> bool:
    return any(isinstance(e, Refused) and e.rank == rank for e in effects)


def _view_reason(version: int, active: bool, cause: dict[str, Any]) -> str:
    where = "in" if active else "outside"
    return f"version {version} committed with it {where} active_ranks ({cause['kind']}: {cause['detail']})"


# -- from a log ----------------------------------------------------------------------------------


async def story_of(
    log: Log,
    group: str,
    rank: int,
    *,
    until: int | None = None,
    fold_page: Callable[[StoryBuilder, list[Record]], Any] | None = None,
) -> dict[str, Any]:
    """Fold ``log`` from offset 1 up to ``until`` (default: its head) and tell the story of
    ``(group, rank)``. ``fold_page`` lets a caller step each page elsewhere (the server steps
    them in a worker thread, so a long log does not hold up its event loop); it must step them
    in order. Raises :class:`StoryError` for an unknown group or a rank out of range."""
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise StoryError(RANK_OUT_OF_RANGE, f"rank {rank!r} must be a non-negative integer")
    return await fold_story(
        log,
        lambda machine: StoryBuilder(group, rank, machine=machine),
        until=until,
        fold_page=fold_page,
        error=StoryError,
        begin=_start_entry,
    )


class Builder(Protocol):
    """What tells a story (a rank's, a facet's): it is fed pages of records and gives the
    story (``result``) or raises its :class:`StoryError`."""

    def feed(self, records: Iterable[Record]) -> None: ...

    def result(self) -> dict[str, Any]: ...


B = TypeVar("B", bound=Builder)


async def fold_story(
    log: Log,
    builder_of: Callable[[Coordinator], B],
    *,
    until: int | None,
    fold_page: Callable[[B, list[Record]], Any] | None,
    error: type[StoryError],
    begin: Callable[[B, Any], None] | None = None,
) -> dict[str, Any]:
    """Every story's fold: ``log`` from offset 1 (or the kept snapshot a compacted log needs;
    none there is ``error(COMPACTED)``) up to ``until`` (default: its head), through the
    builder ``builder_of`` makes on the fold it starts from (``begin`` tells it where it
    starts), page by page (``fold_page``: see :func:`story_of`); then its story."""
    head = await log.head()
    stop = head if until is None else min(until, head)
    try:
        start, machine, _ = await find_start(log, stop)
    except CompactedLog as exc:
        raise error(COMPACTED, str(exc)) from None
    builder = builder_of(machine)
    if begin is not None and start.offset:
        begin(builder, start)
    async for page in read_pages(log, start.offset, stop):
        if fold_page is None:
            builder.feed(page)
        else:
            await fold_page(builder, page)
    return builder.result()


async def story_at(target: str, tell: Callable[[Log], Awaitable[T]]) -> T:
    """``tell(log)`` on the log at ``target`` (a path or URL), opened read-only and closed
    here: ``explain``'s stories from a log file."""
    log = await open_log(target, read_only=True)
    try:
        return await tell(log)
    finally:
        await log.close()


def _start_entry(builder: StoryBuilder, start: Any) -> None:
    """A compacted log is folded from the kept snapshot its removed records lie behind: the
    story says so, and where the rank stood there."""
    g = _group_state(builder.machine, builder.group)
    if g is None or not 0 <= builder.rank < len(g.ranks):
        return
    info = g.ranks[builder.rank]
    view = g.view
    active = view is not None and view.is_active(builder.rank)
    where = (
        f"{'in' if active else 'outside'} active_ranks of version {view.version}"
        if view is not None
        else "before the first view"
    )
    builder.entries.append(
        {
            "offset": start.offset,
            "ts": builder.machine._now,  # noqa: SLF001 - same package, read-only
            "record": "snapshot",
            "event": "kept_snapshot",
            "reason": (
                f"the log is compacted before offset {start.offset}; the story starts from the "
                f"kept snapshot there: rank {builder.rank} {info.state} as incarnation "
                f"{info.incarnation} (rank_epoch {info.rank_epoch}), {where}"
            ),
        }
    )


async def story_from(
    target: str, group: str, rank: int, *, until: int | None = None
) -> dict[str, Any]:
    """:func:`story_of` on the log at ``target`` (a path or URL), opened and closed here."""
    return await story_at(target, lambda log: story_of(log, group, rank, until=until))


# -- as text -------------------------------------------------------------------------------------


def format_story(story: dict[str, Any]) -> str:
    """The story (of a rank, or of a refit: facets/refits/story.py) as lines for a
    terminal: the summary, then one line per entry."""
    lines = [story["summary"], ""]
    header = ("offset", "time (UTC)", "record", "event", "reason")
    rows = [
        (str(e["offset"]), _time(e["ts"]), e["record"], _event_label(e), e["reason"])
        for e in story["entries"]
    ]
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(header[:-1])]
    for row in [header, *rows]:
        lines.append("  ".join([*(c.ljust(w) for c, w in zip(row, widths, strict=False)), row[-1]]))
    omitted = story["omitted"]
    lines.append("")
    beats = (
        f"{story['heartbeats']} heartbeats ({omitted['heartbeats']} not listed), "
        if "heartbeats" in story
        else ""
    )
    lines.append(
        f"folded to offset {story['until']}; {beats}{omitted['evidence']} older evidence items "
        "not listed"
    )
    return "\n".join(lines)


def _event_label(entry: dict[str, Any]) -> str:
    """``rank_state OFFLINE``, ``view_committed v2``: the event with what it set."""
    if "state" in entry:
        return f"{entry['event']} {entry['state']}"
    if entry["event"] in ("view_prepare", "view_committed"):
        return f"{entry['event']} v{entry['version']}"
    for host in facet_hosts():
        label = host.labels.get(entry["event"])
        if label is not None:
            return label(entry)
    return entry["event"]


def _time(ts: int) -> str:
    return dt.datetime.fromtimestamp(ts / 1e9, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
