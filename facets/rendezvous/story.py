"""A torchrun job's rendezvous story (docs/torchrun.md): its creation, every node's join (and
why: it arrived, its workers failed, nodes wait), every round (who is in, in which rank, and
which rule formed it), every node that left (and how: it said so, it went silent, its join
timed out), every join refused (and why) and the closing, each with its offset, time and the
fold's own words.

Read from what the fold did, like a rank's or a refit's story: the log is folded from its
start (or the kept snapshot a compacted log needs) and each step's effects about the job are
kept. Keep-alives say nothing unless they are refused; they are counted.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from ...coordinator.fold.effects import Refused
from ...coordinator.fold.machine import Coordinator
from ...coordinator.host.story import StoryError, fold_story, story_at
from ...eventlog import Log, Record
from ...wire.codes import UNKNOWN_RENDEZVOUS
from .effects import (
    JobClosed,
    JobCreated,
    NodeJoined,
    NodeLeft,
    RoundFormed,
)
from .state import Job, job_status

#: The record kinds of a rendezvous.
RDZV_KINDS = frozenset({"rdzv_join", "rdzv_keepalive", "rdzv_leave", "rdzv_close"})


class RendezvousStoryError(StoryError):
    """No such rendezvous in the log (up to the offset asked). ``code``: the wire error code."""


def _entry(record: Record, event: str, reason: str, **fields: Any) -> dict[str, Any]:
    return {
        "offset": record.offset,
        "ts": record.ts,
        "record": record.kind,
        "event": event,
        "reason": reason,
        **fields,
    }


def rendezvous_entries(record: Record, effects: Iterable[Any], job: str) -> list[dict[str, Any]]:
    """The story entries of one folded step about ``job``."""
    out: list[dict[str, Any]] = []
    for e in effects:
        if isinstance(e, Refused):
            payload = record.payload if isinstance(record.payload, dict) else {}
            if record.kind in RDZV_KINDS and payload.get("job") == job:
                out.append(
                    _entry(
                        record,
                        "refused",
                        f"{record.kind} from node {payload.get('node')} refused: {e.message}",
                        code=e.code,
                        node=payload.get("node"),
                    )
                )
            continue
        if getattr(e, "job", None) != job:
            continue
        if isinstance(e, JobCreated):
            out.append(
                _entry(
                    record,
                    "created",
                    f"rendezvous {job!r} created by node {e.node}'s join: min_nodes "
                    f"{e.min_nodes}, max_nodes {e.max_nodes}, last call {e.last_call_s:g} s, "
                    f"join timeout {e.join_timeout_s:g} s, keep-alive timeout "
                    f"{e.keepalive_timeout_s:g} s",
                    node=e.node,
                )
            )
        elif isinstance(e, NodeJoined):
            out.append(
                _entry(
                    record,
                    "joined",
                    e.reason,
                    node=e.node,
                    round=e.round,
                    cause=e.cause,
                    restart_count=e.restart_count,
                )
            )
        elif isinstance(e, RoundFormed):
            out.append(
                _entry(
                    record,
                    "round",
                    e.reason,
                    round=e.round,
                    nodes=[n.node for n in e.nodes],
                    world_size=e.world_size,
                )
            )
        elif isinstance(e, NodeLeft):
            out.append(_entry(record, e.how, e.reason, node=e.node, round=e.round))
        elif isinstance(e, JobClosed):
            out.append(
                _entry(
                    record,
                    "closed",
                    f"rendezvous {job!r} closed after round {e.round} by node {e.node}: {e.reason}",
                    node=e.node,
                    round=e.round,
                )
            )
    return out


class RendezvousStoryBuilder:
    """Folds records one at a time and keeps what concerns the job ``name``."""

    def __init__(self, name: str, *, machine: Coordinator | None = None) -> None:
        self.name = name
        self.machine = machine or Coordinator()
        self.entries: list[dict[str, Any]] = []
        self.keepalives = 0

    def feed(self, records: Iterable[Record]) -> None:
        for record in records:
            self.step(record)

    def step(self, record: Record) -> None:
        effects = self.machine.step(record)
        if record.kind == "rdzv_keepalive" and not effects:
            if isinstance(record.payload, dict) and record.payload.get("job") == self.name:
                self.keepalives += 1
            return
        if effects:
            self.entries.extend(rendezvous_entries(record, effects, self.name))

    def result(self) -> dict[str, Any]:
        """The story as plain JSON data: the job's state now (``job_status``), a one-line
        ``summary``, the ``entries`` and how many keep-alives were folded."""
        job = self.machine.facet("rendezvous").job(self.name)
        if job is None:
            raise RendezvousStoryError(
                UNKNOWN_RENDEZVOUS,
                f"no rendezvous {self.name!r} in the log up to offset {self.machine.offset}",
            )
        return {
            "job": self.name,
            "until": self.machine.offset,
            "status": job_status(job),
            "summary": rendezvous_summary(job),
            "entries": self.entries,
            "keepalives": self.keepalives,
        }


def rendezvous_summary(job: Job) -> str:
    """``rendezvous 'j' is at round 3: nodes a (rank 0), b (rank 1), 4 workers; 1 waiting``."""
    text = f"rendezvous {job.job!r} is at round {job.round}"
    if job.members:
        nodes = ", ".join(f"{m.node} (rank {m.rank})" for m in job.members)
        workers = job_status(job)["world_size"]
        text += f": nodes {nodes}" + (f", {workers} workers" if workers else "")
    if job.pending:
        text += f"; {len(job.pending)} waiting for round {job.round + 1}"
    if job.closed is not None:
        text += f"; closed by node {job.closed['node']} ({job.closed['reason']})"
    return text


async def rendezvous_story_of(
    log: Log,
    name: str,
    *,
    until: int | None = None,
    fold_page: Callable[[RendezvousStoryBuilder, list[Record]], Any] | None = None,
) -> dict[str, Any]:
    """Fold ``log`` up to ``until`` (default: its head) and tell rendezvous ``name``'s story.
    Raises :class:`RendezvousStoryError` for a rendezvous the log does not hold."""
    return await fold_story(
        log,
        lambda machine: RendezvousStoryBuilder(name, machine=machine),
        until=until,
        fold_page=fold_page,
        error=RendezvousStoryError,
    )


async def rendezvous_story_from(
    target: str, name: str, *, until: int | None = None
) -> dict[str, Any]:
    """:func:`rendezvous_story_of` on the log at ``target``, opened read-only and closed here."""
    return await story_at(target, lambda log: rendezvous_story_of(log, name, until=until))


def shown(story: dict[str, Any]) -> dict[str, Any]:
    """The story as ``explain`` prints it (``format_story``): the job's keepalives where a
    rank's story counts its heartbeats, none of them shown."""
    kept = story["keepalives"]
    return {**story, "heartbeats": kept, "omitted": {"heartbeats": kept, "evidence": 0}}
