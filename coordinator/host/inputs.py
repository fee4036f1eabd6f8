"""An input's way through the host: what it gets back, and how it waits in the queue for it.

A request hands the host one or more records; each becomes an :class:`Input` queued for the loop,
and each gets one :data:`Outcome` once its batch is carried out (or an exception when the host
cannot take it: :class:`HostUnavailable`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from coordinator.fold.machine import Coordinator
from eventlog import NewRecord

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
Precheck = Callable[[Coordinator], Outcome | None]


class HostUnavailable(Exception):
    """The host cannot take inputs: it is closed, deposed (``not_leader``) or its log failed."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


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

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)

    def done(self) -> bool:
        return self.future.done()


class SharedReply:
    """The reply of a shared heartbeat record: every beat in it gets the record's outcome."""

    __slots__ = ("beats",)

    def __init__(self, beats: list[Input]) -> None:
        self.beats = beats

    def set(self, index: int, outcome: Outcome) -> None:
        for beat in self.beats:
            beat.answer(outcome)

    def fail(self, exc: BaseException) -> None:
        for beat in self.beats:
            beat.fail(exc)

    def done(self) -> bool:
        return all(beat.abandoned for beat in self.beats)


@dataclass(slots=True)
class Input:
    """One queued input: the record (validated; ``payload_bytes`` is its encoded payload), where
    its outcome goes, its idempotency ``key`` and ``precheck``, when it arrived (loop clock),
    and when the fold last accepted it."""

    record: NewRecord
    payload_bytes: bytes
    reply: Reply | SharedReply
    index: int
    key: tuple[Any, ...] | None
    precheck: Precheck | None
    arrived: float
    #: the group's ``fence_epoch`` when the fold last accepted it (a heartbeat waiting for
    #: its shared record); -1: never checked
    checked: int = -1

    @property
    def abandoned(self) -> bool:
        return self.reply.done()

    def answer(self, outcome: Outcome) -> None:
        self.reply.set(self.index, outcome)

    def fail(self, exc: BaseException) -> None:
        self.reply.fail(exc)
