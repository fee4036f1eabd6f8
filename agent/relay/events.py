"""``POST /agents/events``: the workers' event requests merged into upstream batches, one in
flight at a time per lane, and each answer split back to its request (the merging and
splitting are pure functions)."""

from __future__ import annotations

import json
import logging
import threading
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...wire.codes import (
    BAD_ANSWER,
    BODY_TOO_LARGE,
    COORDINATOR_UNAVAILABLE,
)
from ...wire.protocol import MAX_EVENTS
from ..channel import ChannelRefused
from .replies import REFUSED, Body, Counters, Reply, error, refused
from .upstream import Unreachable, Upstream

log = logging.getLogger("foldplane.relay")

#: The most bytes of events merged into one upstream batch (the coordinator takes 1 MiB).
MAX_BATCH_BYTES = 512 * 1024
#: The largest request body a worker may send, and the largest channel message the relay
#: sends (the coordinator's default limit: a larger message would close the whole channel).
MAX_BODY_BYTES = 1024 * 1024
#: The most worker event requests waiting for an upstream batch; beyond, ``503``.
MAX_QUEUED_REQUESTS = 1024
#: How long a worker's event request waits for its upstream answer before ``503``.
EVENTS_WAIT_S = 60.0


@dataclass
class EventsRequest:
    """One worker's ``POST /agents/events``, waiting for its share of an upstream answer."""

    events: list[Body]
    nbytes: int
    reply: Reply | None = None
    #: every event carries a token of its own (else the request travels with no token at all)
    tokened: bool = False
    done: threading.Event = field(default_factory=threading.Event)

    def answer(self, reply: Reply) -> None:
        self.reply = reply
        self.done.set()


def with_token(events: Iterable[Mapping[str, Any]], token: str | None) -> list[Body]:
    """The events with the worker's agent token as each one's ``token`` (an event that names
    a token of its own keeps it: the coordinator checks whichever the event carries)."""
    out = []
    for event in events:
        event = dict(event)
        if token is not None and "token" not in event:
            event["token"] = token
        out.append(event)
    return out


def take_batch(
    queue: deque[EventsRequest],
    max_events: int = MAX_EVENTS,
    max_bytes: int = MAX_BATCH_BYTES,
) -> list[EventsRequest]:
    """The requests at the head of ``queue`` that fit one upstream batch, removed from it.

    Whole requests only, in arrival order; the first is always taken, even when it alone is
    over a limit (the coordinator then answers it as it would have answered the worker). A
    batch is all of requests whose every event carries a token, or all of requests that do
    not: an event without a token must never travel with another worker's credentials.
    """
    batch: list[EventsRequest] = []
    events = nbytes = 0
    while queue:
        head = queue[0]
        if batch and (
            events + len(head.events) > max_events
            or nbytes + head.nbytes > max_bytes
            or head.tokened != batch[0].tokened
        ):
            break
        batch.append(queue.popleft())
        events += len(head.events)
        nbytes += head.nbytes
    return batch


def split_results(batch: Sequence[EventsRequest], body: Mapping[str, Any]) -> list[Reply]:
    """Each request's share of the upstream answer ``{"term", "results"}``, in order."""
    results = body.get("results")
    wanted = sum(len(r.events) for r in batch)
    if not isinstance(results, list) or len(results) != wanted:
        got = len(results) if isinstance(results, list) else "no"
        reply = error(BAD_ANSWER, f"the coordinator answered {got} results for {wanted}")
        return [reply] * len(batch)
    replies: list[Reply] = []
    start = 0
    for request in batch:
        end = start + len(request.events)
        replies.append((200, {"term": body.get("term"), "results": results[start:end]}))
        start = end
    return replies


# -- updates: the cache (pure) ---------------------------------------------------------------


class EventsLane:
    """Merges the workers' event requests into upstream batches, one in flight at a time."""

    def __init__(self, upstream: Upstream, stats: Counters, name: str) -> None:
        self._upstream = upstream
        self._stats = stats
        self._queue: deque[EventsRequest] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name=f"foldplane-relay-{name}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=5.0)
        for request in self._queue:
            request.answer(error(COORDINATOR_UNAVAILABLE, "the relay is shutting down"))

    def submit(self, events: list[Body], token: str | None, nbytes: int) -> Reply:
        """Queue one worker's events; block until its share of an upstream answer is back."""
        events = with_token(events, token)
        request = EventsRequest(events, nbytes, tokened=all("token" in e for e in events))
        with self._cond:
            if self._closed:
                return error(COORDINATOR_UNAVAILABLE, "the relay is shutting down")
            if len(self._queue) >= MAX_QUEUED_REQUESTS:
                return error(COORDINATOR_UNAVAILABLE, f"{len(self._queue)} event requests queued")
            self._queue.append(request)
            self._stats.add("events_requests")
            self._cond.notify_all()
        if not request.done.wait(EVENTS_WAIT_S):
            return error(COORDINATOR_UNAVAILABLE, f"no upstream answer within {EVENTS_WAIT_S} s")
        assert request.reply is not None
        return request.reply

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if self._closed:
                    return
                batch = take_batch(self._queue)
            for request, reply in zip(batch, self.send_batch(batch), strict=True):
                request.answer(reply)

    def send_batch(self, batch: list[EventsRequest]) -> list[Reply]:
        """Send one batch upstream on its channel; each request's reply, in order."""
        events = [event for request in batch for event in request.events]
        if sum(r.nbytes for r in batch) > MAX_BATCH_BYTES:
            size = len(json.dumps({"id": 2**53, "events": events}, separators=(",", ":")))
            if size > MAX_BODY_BYTES:
                if len(batch) > 1:
                    return [self.send_batch([request])[0] for request in batch]
                detail = f"{size} bytes with the tokens; at most {MAX_BODY_BYTES}"
                return [error(BODY_TOO_LARGE, detail)]
        self._stats.add("events_upstream")
        self._stats.add("events_sent", len(events))
        if len(batch) > 1:
            self._stats.add("events_merged")
        # Each event's own token decides for it; the door token only gets the batch onto a
        # channel, so it is a token of the batch's first request.
        door = events[0]["token"] if batch[0].tokened else None
        try:
            body = self._upstream.run(self._upstream.send(events, door))
        except ChannelRefused as exc:
            reply = refused(exc, self._upstream.where)
        except Unreachable as exc:
            return [error(COORDINATOR_UNAVAILABLE, str(exc))] * len(batch)
        else:
            code = body.get("error")
            if code is None:
                return split_results(batch, body)
            code = str(code)
            reply = error(code, str(body.get("detail", "")), default_status=503)
        if len(batch) > 1 and reply[0] in REFUSED:
            # refused as a whole: let each worker's request meet its own fate
            return [self.send_batch([request])[0] for request in batch]
        return [reply] * len(batch)
