"""An input's way through the host: what it gets back, and how it waits in the queue for it.

A request hands the host one or more records; they are queued for the loop as :class:`Input` s
(:func:`queue_submission`: a run of heartbeats is one), and each record gets one :data:`Outcome`
once its batch is carried out (or an exception when the host cannot take it:
:class:`HostUnavailable`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from ...eventlog import InvalidRecord, NewRecord
from ...eventlog.record import decode_payload, validate
from ...wire.codes import INVALID_EVENT, NOT_LEADER
from ..fold import registry
from .reads import Reads

# -- what an input gets back ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Appended:
    """The input is durable at ``offset`` and the fold accepted it."""

    offset: int


@dataclass(frozen=True, slots=True)
class Refusal:
    """The input was refused with an error ``code`` (see docs/protocol.md).

    ``offset`` is None when it was refused before the append (the usual case); it is set when the
    fold fenced it while stepping (another input of the same batch made it stale).
    """

    code: str
    detail: str
    offset: int | None = None


@dataclass(frozen=True, slots=True)
class Existing:
    """Nothing was appended: an earlier record already answers it (the id of that record)."""

    id: int


Outcome = Appended | Refusal | Existing
#: A caller's own check against the fold before the append (an idempotency key's earlier
#: record, say): an outcome answers the input at once, None lets it through.
Precheck = Callable[[Reads], Outcome | None]


class HostUnavailable(Exception):
    """The host cannot take inputs: it is closed, deposed (``not_leader``) or its log failed."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail

    @property
    def extra(self) -> dict[str, str | None]:
        """The error body's fields beyond code and detail: a ``not_leader`` names the leader
        (docs/protocol.md, "Failover"), ``None`` when none is known."""
        return {"leader": getattr(self, "leader", None)} if self.code == NOT_LEADER else {}


# -- waiting for it -----------------------------------------------------------------------------


class Reply:
    """The answer to one submission (one request's batch): an outcome per input, then done."""

    __slots__ = ("future", "results", "remaining")

    def __init__(self, future: asyncio.Future[list[Outcome]], n: int) -> None:
        self.future = future
        self.results: list[Any] = [None] * n
        self.remaining = n
        if n == 0:
            future.set_result([])

    def set(self, index: int, outcome: Outcome) -> None:
        if self.future.done():
            return
        self.results[index] = outcome
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.results)

    def set_many(self, indices: list[int], outcome: Outcome) -> None:
        """The same outcome at several places (the beats of one shared record)."""
        if self.future.done():
            return
        results = self.results
        for index in indices:
            results[index] = outcome
        self.remaining -= len(indices)
        if self.remaining == 0:
            self.future.set_result(results)

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def done(self) -> bool:
        return self.future.done()


class Beats:
    """The heartbeats of one group that one submission (an agent host's batch) brought, in a row:
    they go through the host as one input, to one shared record, and get its outcome together.
    Each beat is still checked on its own (``batching.Admission``): one that the fold refuses is
    answered with its refusal and leaves the bundle, the others go on.

    ``ranks[i]`` beat with ``payloads[i]`` (``{"incarnation", "version"?}``), which answers the
    submission's ``indices[i]``. ``checked`` is the group's ``fence_epoch`` when the fold last
    accepted them, -1 before; ``precheck`` a caller's own check (a beat submitted with one);
    ``arrived`` when they did (loop clock)."""

    __slots__ = (
        "group",
        "reply",
        "arrived",
        "ranks",
        "payloads",
        "indices",
        "checked",
        "precheck",
    )

    def __init__(
        self, group: str, reply: Reply, arrived: float, precheck: Precheck | None = None
    ) -> None:
        self.group = group
        self.reply = reply
        self.arrived = arrived
        self.ranks: list[int] = []
        self.payloads: list[dict[str, Any]] = []
        self.indices: list[int] = []
        self.checked = -1
        self.precheck = precheck

    def add(self, rank: int, payload: dict[str, Any], index: int) -> None:
        self.ranks.append(rank)
        self.payloads.append(payload)
        self.indices.append(index)

    def __len__(self) -> int:
        return len(self.ranks)

    @property
    def abandoned(self) -> bool:
        return self.reply.done()

    def refuse(self, refused: dict[int, Outcome]) -> None:
        """Answer the beats at these positions with their outcomes and drop them."""
        keep = [i for i in range(len(self.ranks)) if i not in refused]
        for position, outcome in refused.items():
            self.reply.set(self.indices[position], outcome)
        self.ranks = [self.ranks[i] for i in keep]
        self.payloads = [self.payloads[i] for i in keep]
        self.indices = [self.indices[i] for i in keep]

    def answer(self, outcome: Outcome) -> None:
        self.reply.set_many(self.indices, outcome)

    def fail(self, exc: BaseException) -> None:
        self.reply.fail(exc)


class SharedReply:
    """The reply of a shared heartbeat record: every beat in it gets the record's outcome."""

    __slots__ = ("beats",)

    def __init__(self, beats: list[Beats]) -> None:
        self.beats = beats

    def set(self, index: int, outcome: Outcome) -> None:
        for beats in self.beats:
            beats.answer(outcome)

    def fail(self, exc: BaseException) -> None:
        for beats in self.beats:
            beats.fail(exc)

    def done(self) -> bool:
        return all(beats.abandoned for beats in self.beats)


@dataclass(slots=True)
class Input:
    """One queued input: the record (validated; ``payload_bytes`` is its encoded payload), where
    its outcome goes, its idempotency ``key`` and ``precheck``, and when it arrived (loop clock).
    A submission's heartbeats in a row are one input, ``beats`` (its record is a ``heartbeat``
    of the group with no rank, standing for them; never appended as it is)."""

    record: NewRecord
    payload_bytes: bytes
    reply: Reply | SharedReply
    index: int
    key: tuple[Any, ...] | None
    precheck: Precheck | None
    arrived: float
    beats: Beats | None = None

    @property
    def abandoned(self) -> bool:
        return self.reply.done()

    def answer(self, outcome: Outcome) -> None:
        self.reply.set(self.index, outcome)

    def fail(self, exc: BaseException) -> None:
        self.reply.fail(exc)


def batch_key(record: NewRecord, facets: registry.Facets | None = None) -> tuple[Any, ...] | None:
    """The key that keeps an input out of a batch that holds another of the same key, as a
    facet declares it for its kinds (``FacetPlugin.batch_key``: a refit transfer's start is
    keyed as ``POST /refits/{refit}/transfers`` keys the operator's, so two starts of one
    transfer never share a batch, ``batching.take_batch``); ``facets``: the host's (the
    command line's when None)."""
    of = (facets or registry.default()).batch_keys.get(record.kind)
    return None if of is None or not isinstance(record.payload, dict) else of(record.payload)


def queue_submission(
    queue: deque[Input],
    records: Sequence[NewRecord],
    reply: Reply,
    key: tuple[Any, ...] | None,
    precheck: Precheck | None,
    now: float,
    *,
    normalized: bool,
    facets: registry.Facets | None = None,
) -> None:
    """Queue one submission's records for the loop (``Host.submit_many``), each validated on
    arrival: an invalid one is answered at once. Its heartbeats in a row, of one group, become
    one :class:`Beats` input; everything else an input of its own, in the submission's order.

    ``normalized``: each payload already equals what decoding its JSON gives back, so the fold
    may take it as it is; otherwise the fold gets the decoded JSON, exactly what a reader of
    the log decodes. A beat is never appended as it is (it waits for a shared record, which is
    validated when it is built), so a normalized beat is not encoded at all. An input without
    a caller's ``key`` gets the one its facet declares (:func:`batch_key`). ``facets``: the
    host's, whose kinds it accepts (the command line's when None)."""
    facets = facets or registry.default()
    beats: Beats | None = None
    for index, record in enumerate(records):
        heartbeat = (
            record.kind == "heartbeat"
            and record.rank is not None
            and record.group is not None
            and key is None
            and precheck is None
        )
        if not (heartbeat and normalized):
            try:
                payload_bytes = validate(record, facets.all_kinds)
            except InvalidRecord as exc:
                reply.set(index, Refusal(INVALID_EVENT, str(exc)))
                beats = None
                continue
            if not normalized:
                record = msgspec.structs.replace(record, payload=decode_payload(payload_bytes))
        if heartbeat:
            group = record.group
            if beats is None or beats.group != group:
                beats = Beats(group, reply, now)  # type: ignore[arg-type]
                stand_in = NewRecord(kind="heartbeat", group=group, rank=None, payload={})
                queue.append(Input(stand_in, b"", reply, -1, None, None, now, beats))
            beats.add(record.rank, record.payload, index)  # type: ignore[arg-type]
            continue
        beats = None
        own = key if key is not None else batch_key(record, facets)
        queue.append(Input(record, payload_bytes, reply, index, own, precheck, now))
