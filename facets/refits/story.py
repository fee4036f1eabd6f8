"""A refit's story (docs/refit.md): its creation, each epoch (why it began, when every slot
joined and with which digest, or which slots never did), each join and each transfer (started,
every member's report, completed or failed and why), each with its offset, time and the fold's
own words.

Read from what the fold did, like a rank's story (coordinator/host/story.py): the refit effects
(``RefitCreated``, ``RefitEpochChanged``, ``TransferChanged``) and, for a join or a ``done``
report (which leave no effect of their own unless they admit an epoch or complete a transfer),
the record itself once the fold accepted it (no ``Refused`` for it). The same entries, narrowed
to one rank, are part of that rank's story: :func:`refit_entries` is shared by both.

Memory stays bounded like a rank's story: every decision (creation, epoch, transfer change) is
kept, but joins and reports only as the last :data:`EVIDENCE_LIMIT` before each decision.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from ...coordinator.fold.effects import Refused
from ...coordinator.fold.machine import Coordinator
from ...coordinator.fold.reasons import abridged, ranks_text
from ...coordinator.host.facets import RankStoryPart
from ...coordinator.host.story import StoryError, fold_story, story_at
from ...eventlog import Log, Record
from ...wire.codes import UNKNOWN_REFIT
from .effects import (
    RefitCreated,
    RefitEpochChanged,
    TransferChanged,
)
from .state import ADMITTED, TIMED_OUT, WAITING, Refit

#: Joins and reports kept before each decision.
EVIDENCE_LIMIT = 32
#: Record kinds a refit's evidence comes from.
REFIT_INPUTS = ("refit_join", "transfer_status")

Entry = tuple[str, str, dict[str, Any]]  # as coordinator.host.facets.Entry


class RefitStoryError(StoryError):
    """No such refit in the log (up to the offset asked). ``code`` is the wire error code."""


def _short(digest: str | None) -> str:
    return "none" if digest is None else f"{digest[:12]}..."


def _created(effect: RefitCreated) -> Entry:
    s = effect.spec
    pinned = f", digest pinned to {_short(s['digest'])}" if s["digest"] else ""
    return (
        "refit_created",
        f"refit {effect.refit!r} created: publisher group {s['publisher']!r} "
        f"({s['publisher_slots']} slots) to subscriber group {s['subscriber']!r} "
        f"({s['subscriber_slots']} slots), {s['lanes']} lanes, readiness timeout "
        f"{s['readiness_timeout_s']:g} s, transfer timeout {s['transfer_timeout_s']:g} s{pinned}",
        {
            "refit": effect.refit,
            "publisher": s["publisher"],
            "subscriber": s["subscriber"],
            "lanes": s["lanes"],
        },
    )


def _epoch(effect: RefitEpochChanged) -> Entry:
    head = f"refit {effect.refit!r} epoch {effect.epoch}"
    if effect.status == WAITING:
        reason = f"{head} began, waiting for every slot to join: {effect.cause}"
    elif effect.status == ADMITTED:
        slots = len(effect.publisher_ranks) + len(effect.subscriber_ranks)
        reason = (
            f"{head} admitted: all {slots} slots joined with digest {_short(effect.digest)} "
            f"(publisher ranks {ranks_text(effect.publisher_ranks)}, subscriber ranks "
            f"{ranks_text(effect.subscriber_ranks)}, {effect.lanes} lanes)"
        )
    elif effect.status == TIMED_OUT:
        reason = f"{head} timed out: never joined: {abridged(list(effect.missing))}"
    else:
        reason = f"{head} is {effect.status}"
    return (
        "refit_epoch",
        reason,
        {
            "refit": effect.refit,
            "epoch": effect.epoch,
            "status": effect.status,
            "cause": effect.cause,
            "digest": effect.digest,
        },
    )


def _transfer(effect: TransferChanged) -> Entry:
    what = f"refit {effect.refit!r} transfer {effect.key!r} (#{effect.transfer})"
    if effect.status == "running":
        reason = f"{what} started: attempt {effect.attempt} in epoch {effect.epoch}"
    else:
        reason = f"{what} attempt {effect.attempt} {effect.status}: {effect.detail}"
    return (
        "transfer",
        reason,
        {
            "refit": effect.refit,
            "transfer": effect.transfer,
            "key": effect.key,
            "attempt": effect.attempt,
            "epoch": effect.epoch,
            "status": effect.status,
        },
    )


def _input(record: Record, r: Refit) -> Entry | None:
    """A join or a status report the fold accepted, said from the refit's state after it."""
    p = record.payload
    role = r.role_of(record.group) if record.group is not None else None
    if role is None or record.rank is None:
        return None
    if record.kind == "refit_join":
        slot = p.get("slot")
        return (
            "refit_join",
            f"{role} slot {slot} ({record.group} rank {record.rank}) joined refit {r.name!r} "
            f"epoch {p.get('epoch')} with digest {_short(p.get('digest'))} "
            f"({len(r.joined)} of {len(r.every_slot())} slots)",
            {"refit": r.name, "epoch": p.get("epoch"), "role": role, "slot": slot},
        )
    t = r.transfers.get(p.get("transfer"))  # type: ignore[arg-type]
    if t is None:
        return None
    count = f" ({len(t.done)} of {len(r.every_slot())} done)" if p.get("status") == "done" else ""
    said = f": {p['detail']}" if p.get("detail") else ""
    return (
        "transfer_status",
        f"{role} {record.group} rank {record.rank} reported transfer {t.key!r} attempt "
        f"{p.get('attempt')} {p.get('status')}{said}{count}",
        {
            "refit": r.name,
            "transfer": t.id,
            "key": t.key,
            "attempt": p.get("attempt"),
            "status": p.get("status"),
        },
    )


def refit_entries(
    record: Record,
    effects: list[Any],
    machine: Coordinator,
    *,
    refit: str | None = None,
    groups: Iterable[str] = (),
) -> tuple[list[Entry], list[Entry]]:
    """``(decisions, evidence)`` of one folded step about refits: of ``refit`` by name, or of
    every refit over one of ``groups``. Evidence (a join, a report) comes from the record once
    the fold accepted it."""
    wanted = set(groups)

    def concerns(name: str, pair: tuple[str, str]) -> bool:
        return name == refit if refit is not None else bool(wanted.intersection(pair))

    decisions: list[Entry] = []
    for effect in effects:
        if isinstance(effect, RefitCreated):
            pair = (effect.spec["publisher"], effect.spec["subscriber"])
            if concerns(effect.refit, pair):
                decisions.append(_created(effect))
        elif isinstance(effect, RefitEpochChanged):
            if concerns(effect.refit, effect.groups):
                decisions.append(_epoch(effect))
        elif isinstance(effect, TransferChanged) and concerns(effect.refit, effect.groups):
            decisions.append(_transfer(effect))
    evidence: list[Entry] = []
    if record.kind in REFIT_INPUTS and not any(isinstance(e, Refused) for e in effects):
        name = record.payload.get("refit") if isinstance(record.payload, dict) else None
        r = machine.facet("refits").refit(name) if isinstance(name, str) else None
        if r is not None and concerns(r.name, r.groups):
            entry = _input(record, r)
            if entry is not None:
                evidence.append(entry)
    return decisions, evidence


class RefitRankStory(RankStoryPart):
    """The refits facet's part of a rank's story: the refits over the rank's group, each
    decision with the rank's place in an admitted epoch, and the rank's own joins and
    reports."""

    def stepped(
        self, record: Record, effects: list[Any], machine: Coordinator
    ) -> tuple[list[Entry], list[Entry]]:
        if not effects and record.kind not in REFIT_INPUTS:
            return [], []  # most records (heartbeats) say nothing about refits
        decisions, evidence = refit_entries(record, effects, machine, groups=(self.group,))
        if record.group != self.group or record.rank != self.rank:
            evidence = []
        placed = []
        for event, reason, fields in decisions:
            if event == "refit_epoch" and fields["status"] == "admitted":
                reason += f"; {self._place(machine, fields['refit'])}"
            placed.append((event, reason, fields))
        return placed, evidence

    def _place(self, machine: Coordinator, name: str) -> str:
        r = machine.facet("refits").refit(name)
        member = None if r is None else r.member_slot(self.group, self.rank)
        if r is None or member is None:
            return f"rank {self.rank} is not a member"
        refit_rank = r.every_slot().index(member)
        return f"rank {self.rank} is {member[0]} slot {member[1]} (refit rank {refit_rank})"


def refit_epoch_label(entry: dict[str, Any]) -> str:
    return f"refit_epoch e{entry['epoch']} {entry['status']}"


def _entry(record: Record, entry: Entry) -> dict[str, Any]:
    event, reason, fields = entry
    return {
        "offset": record.offset,
        "ts": record.ts,
        "record": record.kind,
        "event": event,
        "reason": reason,
        **fields,
    }


class RefitStoryBuilder:
    """Folds records one at a time and keeps what concerns the refit ``name``."""

    def __init__(
        self,
        name: str,
        *,
        evidence_limit: int = EVIDENCE_LIMIT,
        machine: Coordinator | None = None,
    ) -> None:
        self.name = name
        self.machine = machine or Coordinator()
        self.entries: list[dict[str, Any]] = []
        self._evidence: deque[dict[str, Any]] = deque(maxlen=evidence_limit)
        self.omitted = {"evidence": 0}

    def feed(self, records: Iterable[Record]) -> None:
        for record in records:
            self.step(record)

    def step(self, record: Record) -> None:
        effects = self.machine.step(record)
        decisions, evidence = refit_entries(record, effects, self.machine, refit=self.name)
        for entry in evidence:
            if len(self._evidence) == self._evidence.maxlen:
                self.omitted["evidence"] += 1
            self._evidence.append(_entry(record, entry))
        if decisions:
            self.entries.extend(self._evidence)
            self._evidence.clear()
            self.entries.extend(_entry(record, entry) for entry in decisions)

    def result(self) -> dict[str, Any]:
        """The story as plain JSON data: ``refit``, ``until``, ``epoch``, ``status``,
        ``members``, ``transfers``, a one-line ``summary``, ``entries`` and ``omitted``."""
        r = self.machine.facet("refits").refit(self.name)
        if r is None:
            raise RefitStoryError(
                UNKNOWN_REFIT,
                f"no refit {self.name!r} in the log up to offset {self.machine.offset}",
            )
        return {
            "refit": r.name,
            "until": self.machine.offset,
            "epoch": r.epoch,
            "status": r.status,
            "members": r.members(),
            "transfers": [r.transfers[t].to_dict() for t in sorted(r.transfers)],
            "summary": refit_summary(r),
            "entries": [*self.entries, *self._evidence],
            "omitted": dict(self.omitted),
        }


def refit_summary(r: Refit) -> str:
    """``refit 'rl' (train -> gen) epoch 3 admitted (6 members); began: ...; last transfer ...``."""
    publisher, subscriber = r.groups
    text = f"refit {r.name!r} ({publisher} -> {subscriber}) is at epoch {r.epoch}, {r.status}"
    if r.status == ADMITTED:
        text += f" ({len(r.members())} members, digest {_short(r.digest)})"
    elif r.status == TIMED_OUT:
        text += f" (never joined: {abridged(list(r.missing))})"
    text += f"; epoch {r.epoch} began: {r.cause}"
    if r.transfers:
        t = r.transfers[max(r.transfers)]
        text += f"; transfer {t.key!r} attempt {t.attempt} {t.status}"
        if t.status != "running":
            text += f" ({t.detail})"
    return text


async def refit_story_of(
    log: Log,
    name: str,
    *,
    until: int | None = None,
    fold_page: Callable[[RefitStoryBuilder, list[Record]], Any] | None = None,
) -> dict[str, Any]:
    """Fold ``log`` from offset 1 (or the kept snapshot a compacted log needs) up to ``until``
    (default: its head) and tell refit ``name``'s story. Raises :class:`RefitStoryError` for a
    refit the log does not hold."""
    return await fold_story(
        log,
        lambda machine: RefitStoryBuilder(name, machine=machine),
        until=until,
        fold_page=fold_page,
        error=RefitStoryError,
    )


async def refit_story_from(target: str, name: str, *, until: int | None = None) -> dict[str, Any]:
    """:func:`refit_story_of` on the log at ``target`` (a path or URL), opened and closed here."""
    return await story_at(target, lambda log: refit_story_of(log, name, until=until))
