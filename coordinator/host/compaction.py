"""``python -m coordinator compact``: remove heartbeat-class records behind a kept snapshot.

The log grows by every heartbeat, tick and links report; once folded into a snapshot, most of
them decided nothing. Compaction removes those (:func:`coordinator.host.retention.removable` is the
rule) the way raft compacts its log behind a snapshot, and keeps every decision-bearing record
and every projection (views, proposals) for the life of the log.

How a run goes, and why:

1. **Verify first.** Fold from where the retained log starts (its latest kept snapshot, or
   offset 1) to the head with replay's own code and compare with the stored projections; the
   host's latest snapshot, if it lies in the range, must equal the fold's state there. Any
   divergence: nothing is removed, the run fails.
2. **Plan.** The *region* is the prefix of that range the policy allows: behind the stored
   projections (their offset, or the host's snapshot, taken only once every row before it was
   written), and older than the last ``--retain`` records or time. Its
   removable records are cut into steps of at most ``step_records``.
3. **Remove, step by step.** Fold the region again; at each step's last offset S, encode the
   host's snapshot at S (fold and host state, plus a digest of the views committed since the
   previous step, which replay checks later), check it decodes to the fold's state, and call
   ``Log.compact``: the snapshot kept at S, the step's records deleted, its removed range
   recorded and the previous kept snapshot shrunk to a summary of what its step verified (so
   the log holds one whole kept state, not one per step), in one transaction. A crash leaves whole steps only; the next run starts from the
   last kept snapshot and finishes the job.

A run never writes records and never claims the log's term, so it may run beside the serving
coordinator (``serve --retain`` starts it as a child process now and then, off the event loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ...eventlog import Log, Record, RemovedRange, open_log
from ..fold.effects import Effect, ViewCommitted
from ..fold.machine import Coordinator
from ..fold.projections import view_doc
from .ready import HostState, ReadyBuilder
from .replay import (
    CompactedLog,
    OnRecord,
    Start,
    compaction_meta,
    find_start,
    read_pages,
    replay_log,
    summary,
    views_digest,
)
from .retention import RetainPolicy, removable
from .snapshots import CONSUMER, decode_snapshot, encode_snapshot

log = logging.getLogger("foldplane.compaction")

#: Records removed per compaction step (one transaction, one kept snapshot) by default.
STEP_RECORDS = 20_000

_canonical = msgspec.json.Encoder(order="sorted")


@dataclass
class CompactionReport:
    start: Start = field(default_factory=Start)
    head: int = 0
    projected: int = 0
    #: The last offset the policy let this run remove from (0: nothing to do).
    region_end: int = 0
    steps: list[tuple[int, RemovedRange]] = field(default_factory=list)
    divergences: list[str] = field(default_factory=list)
    bytes_before: int = 0
    bytes_after: int = 0

    @property
    def ok(self) -> bool:
        return not self.divergences

    @property
    def removed(self) -> int:
        return sum(r.removed for _, r in self.steps)

    def as_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "start": self.start.as_json(),
            "head": self.head,
            "projected_to": self.projected,
            "region_end": self.region_end,
            "steps": [
                {"snapshot": at, "first": r.first, "last": r.last, "removed": r.removed}
                for at, r in self.steps
            ],
            "removed": self.removed,
            "divergences": self.divergences,
            "bytes_before": self.bytes_before,
            "bytes_after": self.bytes_after,
        }

    def describe(self) -> str:
        if not self.ok:
            return f"FAILED: {len(self.divergences)} divergence(s); nothing was removed"
        if not self.steps:
            return (
                f"nothing to remove behind offset {self.region_end or self.start.offset} "
                f"(head {self.head}, projections at {self.projected})"
            )
        first, last = self.steps[0][1].first, self.steps[-1][0]
        return (
            f"removed {self.removed:,} heartbeat-class records from offsets {first}-{last} in "
            f"{len(self.steps)} step(s), each behind a kept snapshot (the last at offset "
            f"{last}); the store holds {self.bytes_after:,} bytes, {self.bytes_before:,} before"
        )


async def compact(
    target: str,
    policy: RetainPolicy = RetainPolicy(keep_records=0),
    *,
    step_records: int = STEP_RECORDS,
    now_ns: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_step: Callable[[int, RemovedRange], None] | None = None,
) -> CompactionReport:
    """Open ``target`` (it must exist) and compact it; see the module docstring."""
    log_ = await open_log(target, create=False)
    try:
        return await compact_log(
            log_,
            policy,
            step_records=step_records,
            now_ns=now_ns,
            progress=progress,
            on_step=on_step,
        )
    finally:
        await log_.close()


async def compact_log(
    log_: Log,
    policy: RetainPolicy = RetainPolicy(keep_records=0),
    *,
    step_records: int = STEP_RECORDS,
    now_ns: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    on_step: Callable[[int, RemovedRange], None] | None = None,
) -> CompactionReport:
    """Compact an open log: verify, plan, remove (see the module docstring). ``on_step`` is
    called after each step committed, with the kept snapshot's offset and the range."""
    if step_records < 1:
        raise ValueError(f"step_records must be at least 1, got {step_records}")
    report = CompactionReport(bytes_before=await log_.stored_bytes())
    report.head = await log_.head()
    report.projected = await log_.get_consumer_offset(CONSUMER)
    host_snapshot = await log_.load_snapshot(CONSUMER)
    # Every row the effects up to the host's snapshot produce was written before it was taken
    # (records that produce none do not move the projections' offset), so a kept snapshot
    # there never lets a restarted host skip a row it still owes.
    limit = max(report.projected, host_snapshot[0] if host_snapshot else 0)
    if policy.keep_records is not None:
        limit = min(limit, report.head - policy.keep_records)
    ts_limit = None
    if policy.keep_ns is not None:
        ts_limit = (time.time_ns() if now_ns is None else now_ns) - policy.keep_ns

    # 1 and 2: verify the whole retained log, and plan the steps on the way
    planners: list[_Planner] = []

    def fresh() -> OnRecord:
        planners.append(_Planner(limit, ts_limit, step_records, host_snapshot))
        return planners[-1]

    checked = await replay_log(log_, progress=progress, on_record=fresh)
    plan = planners[-1]
    plan.finish()
    report.start = checked.start
    report.divergences = checked.divergences + plan.problems
    report.region_end = plan.region_end
    if not report.ok or not plan.boundaries:
        report.bytes_after = report.bytes_before
        return report

    # 3: fold the region again, removing step by step
    start, machine, data = await find_start(log_, plan.region_end)
    if start.offset != report.start.offset:
        raise CompactedLog(
            f"another compaction moved the log's start from offset {report.start.offset} to "
            f"{start.offset} during this run; run it again"
        )
    state = decode_snapshot(data)[1] if data is not None else HostState()
    builder = ReadyBuilder.for_machine(machine, state)
    meta = compaction_meta(data) if data is not None else None
    await _remove(log_, builder, machine, start.offset, meta, plan, report, on_step)
    report.bytes_after = await log_.stored_bytes()
    return report


class _Planner:
    """The verifying fold's hook: finds the region and the offsets its steps end at."""

    def __init__(
        self,
        limit: int,
        ts_limit: int | None,
        step_records: int,
        host_snapshot: tuple[int, bytes] | None,
    ) -> None:
        self.limit = limit
        self.ts_limit = ts_limit
        self.step_records = step_records
        self.host_snapshot = host_snapshot
        self.region_end = 0
        self.open = True
        self.pending = 0
        self.boundaries: list[int] = []
        self.problems: list[str] = []

    def __call__(self, rec: Record, effects: list[Effect], machine: Coordinator) -> None:
        if self.host_snapshot is not None and rec.offset == self.host_snapshot[0]:
            self._check_host_snapshot(machine)
        if not self.open:
            return
        if rec.offset > self.limit or (self.ts_limit is not None and rec.ts > self.ts_limit):
            self.open = False
            if self.pending:
                self.boundaries.append(self.region_end)
            return
        self.region_end = rec.offset
        if removable(rec, effects):
            self.pending += 1
            if self.pending == self.step_records:
                self.boundaries.append(rec.offset)
                self.pending = 0

    def finish(self) -> None:
        if self.open and self.pending:
            self.boundaries.append(self.region_end)
            self.open = False

    def _check_host_snapshot(self, machine: Coordinator) -> None:
        offset, data = self.host_snapshot  # type: ignore[misc]
        try:
            stored, _ = decode_snapshot(data)
        except Exception as exc:
            self.problems.append(f"the host's snapshot at offset {offset} cannot be read: {exc}")
            return
        if _state(stored) != _state(machine):
            self.problems.append(
                f"the host's snapshot at offset {offset} is not the fold's state there"
            )


def _state(machine: Coordinator) -> bytes:
    return _canonical.encode(machine.snapshot())


async def _remove(
    log_: Log,
    builder: ReadyBuilder,
    machine: Coordinator,
    after: int,
    after_meta: dict[str, Any] | None,
    plan: _Planner,
    report: CompactionReport,
    on_step: Callable[[int, RemovedRange], None] | None,
) -> None:
    """Fold the region again from ``after`` (the kept snapshot there carries ``after_meta``)
    and write each planned step; each step shrinks the snapshot it supersedes to a summary."""
    boundaries = set(plan.boundaries)
    pending: list[int] = []
    views: list[dict[str, Any]] = []
    async for page in read_pages(log_, after, plan.region_end):
        for rec in page:
            effects = machine.step(rec)
            # the host's own bookkeeping, so the kept snapshot restores a host exactly (the
            # Ready itself, and its projection rows, are the serving host's business)
            builder.ready(rec.offset, effects, projected=rec.offset)
            for effect in effects:
                if isinstance(effect, ViewCommitted):
                    views.append(view_doc(effect.view))
            if removable(rec, effects):
                pending.append(rec.offset)
            if rec.offset in boundaries and pending:
                meta = {"after": after, "views": len(views), "views_sha256": views_digest(views)}
                previous = summary(after, after_meta) if after else None
                data = _kept_snapshot(machine, builder.state, meta)
                removed = await log_.compact(CONSUMER, rec.offset, data, pending, previous=previous)
                assert removed is not None
                report.steps.append((rec.offset, removed))
                if on_step is not None:
                    on_step(rec.offset, removed)
                after, after_meta, pending, views = rec.offset, meta, [], []


def _kept_snapshot(machine: Coordinator, state: HostState, meta: dict[str, Any]) -> bytes:
    """The host's snapshot at the fold's offset, with what this step verified; checked to
    decode back to exactly the fold's state before it is kept."""
    doc = msgspec.json.decode(encode_snapshot(machine, state))
    doc["compaction"] = meta
    data = msgspec.json.encode(doc)
    restored, _ = decode_snapshot(data)
    if _state(restored) != _state(machine):
        raise RuntimeError(
            f"the snapshot at offset {machine.offset} does not decode to the fold's state"
        )
    return data


# -- serve --retain -----------------------------------------------------------------------------


def compact_argv(target: str, policy_text: str) -> list[str]:
    """The command line of a compaction run under this interpreter."""
    return [sys.executable, "-m", "foldplane.coordinator", "compact", target, "--retain", policy_text]


async def retain_periodically(
    target: str, policy_text: str, every_s: float, *, is_leader: Callable[[], bool]
) -> None:
    """Run ``compact`` as a child process every ``every_s`` seconds while this coordinator
    leads: the fold and the deletes run in another process, so the event loop only waits for
    it to exit. A failed run is logged; the next one starts from what the last step kept."""
    while True:
        await asyncio.sleep(every_s)
        if not is_leader():
            continue
        proc = await asyncio.create_subprocess_exec(
            *compact_argv(target, policy_text),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await proc.communicate()
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        text = (out or b"").decode(errors="replace").strip().splitlines()
        if proc.returncode == 0:
            log.info("retention: %s", text[-1] if text else "done")
        else:
            log.error(
                "retention: compact exited with %d: %s",
                proc.returncode,
                (err or b"").decode(errors="replace").strip()[-2000:],
            )
