"""A facet's events, sent by a worker and answered to it (``Agent.send_event``).

A facet beside membership may take events from the agents (its plugin's ``events``,
``coordinator/fold/registry.py``): Structs of ``wire.protocol.AgentEventBase``, each tagged with
one of the facet's record kinds. A worker sends one through its agent: the agent adds the
envelope (group, rank, incarnation), validates it against its Struct, queues it in the events
lane with the rest (``agent.machine``: ``SendEvent``) and hands the coordinator's answer back
(``EventAnswered``). An accepted event gives the offset of its record; a refused one raises
:class:`EventRefused` with the fold's code and reason, and never ends the agent.

Answers are matched to the call by the event's kind and fields, so two calls that send the
same event at the same time share one answer (the coordinator answers a repeat with the
record it repeats).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from ..wire.codes import AGENT_STOPPED
from ..wire.protocol import AgentEventBase
from .facets import ANSWERED_BY
from .machine import OWN_EVENTS

#: How long a call waits for the coordinator's answer to its event, by default.
ANSWER_S = 30.0
#: The envelope the agent adds to every event.
_ENVELOPE = frozenset({"type", "group", "rank", "incarnation", "token"})


class EventRefused(RuntimeError):
    """The coordinator refused an event; ``code`` is its error code (``wire.codes``) and
    ``detail`` the fold's reason."""

    def __init__(self, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.code = code
        self.detail = detail


def answer_key(kind: str, fields: dict[str, Any]) -> tuple[Any, ...]:
    """What matches an answer to the call that sent its event."""
    return (kind, *sorted((k, repr(v)) for k, v in fields.items()))


def event_fields(
    event_type: type,
    fields: dict[str, Any],
    envelope: dict[str, Any],
    answered_by: Mapping[str, str] = ANSWERED_BY,
) -> dict:
    """``fields`` validated as an event of ``event_type``, as the events lane sends them:
    without the envelope, defaults left out. A kind the agent sends itself, or a facet's
    worker part (``answered_by``: the facet whose part sends each such kind), or a field that
    does not fit, is a ValueError that names it."""
    if not (isinstance(event_type, type) and issubclass(event_type, AgentEventBase)):
        raise ValueError(f"{event_type!r} is not an agent event (a wire.protocol.AgentEventBase)")
    kind = event_type.__struct_config__.tag  # type: ignore[attr-defined]
    if kind in OWN_EVENTS:
        raise ValueError(f"{kind!r} is the agent's own event, not a facet's; the agent sends it")
    if kind in answered_by:
        raise ValueError(
            f"{kind!r} is the event of the {answered_by[kind]} facet's worker part, which sends it"
        )
    if _ENVELOPE & fields.keys():
        raise ValueError(f"the agent fills {sorted(_ENVELOPE & fields.keys())} of an event itself")
    try:
        event = msgspec.convert({**fields, **envelope, "type": kind}, event_type)
    except msgspec.ValidationError as exc:
        raise ValueError(f"not a valid {kind!r} event: {exc}") from None
    return {k: v for k, v in msgspec.to_builtins(event).items() if k not in _ENVELOPE}


class EventAnswers:
    """The answers to the events this rank's callers sent, fed by the agent's driver thread
    (:meth:`on_answer`, :meth:`on_stopped`) and waited on by the callers (:meth:`send`)."""

    def __init__(self, send: Callable[[str, dict[str, Any]], None]) -> None:
        self._send = send
        self._cond = threading.Condition()
        self._answers: dict[tuple[Any, ...], tuple[int | None, str | None, str]] = {}
        self.stopped: str | None = None

    def on_answer(
        self, kind: str, fields: dict[str, Any], offset: int | None, error: str | None, detail: str
    ) -> None:
        with self._cond:
            self._answers[answer_key(kind, fields)] = (offset, error, detail)
            self._cond.notify_all()

    def on_stopped(self, why: str) -> None:
        with self._cond:
            self.stopped = why
            self._cond.notify_all()

    def send(self, kind: str, fields: dict[str, Any], timeout: float = ANSWER_S) -> int | None:
        """Send one event and wait for its answer: the offset of its record; raise
        :class:`EventRefused` on a refusal, TimeoutError when no answer came in time."""
        key = answer_key(kind, fields)
        with self._cond:
            self._answers.pop(key, None)
        self._send(kind, fields)
        with self._cond:
            if not self._cond.wait_for(
                lambda: key in self._answers or self.stopped is not None, timeout
            ):
                raise TimeoutError(f"no answer to {kind} within {timeout:g} s")
            if key not in self._answers:
                raise EventRefused(AGENT_STOPPED, str(self.stopped))
            offset, error, detail = self._answers.pop(key)
        if error is not None:
            raise EventRefused(error, detail)
        return offset


__all__ = ["ANSWER_S", "EventAnswers", "EventRefused", "answer_key", "event_fields"]
