"""The relay's side toward the coordinator: one event loop, in a thread of its own, runs every
channel; the workers' request threads hand it coroutines and wait with a deadline."""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ...wire.codes import (
    NOT_LEADER,
)
from ..channel import ChannelClosed, ChannelLink, HostChannel
from ..client import (
    parse_addresses,
)
from .replies import Body, Counters, unreachable

log = logging.getLogger("foldplane.relay")

T = TypeVar("T")


class Unreachable(Exception):
    """No coordinator answered: none could be reached, the channel was lost, or no answer came
    in time (the message says which)."""


def channel_addresses(addresses: str | Sequence[str]) -> tuple[list[tuple[str, int]], bool]:
    """The ``(host, port)`` of each coordinator URL, and whether they are ``https://`` (all of
    them or none: one cluster's coordinators are behind TLS or not)."""
    out = []
    schemes = set()
    for url in parse_addresses(addresses):
        parts = urlsplit(url)
        schemes.add(parts.scheme)
        default = 443 if parts.scheme == "https" else 80
        out.append((parts.hostname or "127.0.0.1", parts.port or default))
    if len(schemes) > 1:
        raise ValueError(f"coordinator addresses mix http:// and https://: {addresses!r}")
    return out, schemes == {"https"}


class Upstream:
    """The relay's side toward the coordinator: an event loop in a daemon thread of its own runs
    every channel (the lanes' and the two the event lanes share), and the workers' threads hand
    it coroutines with :meth:`run`."""

    def __init__(self, addresses: str | Sequence[str], timeout_s: float, stats: Counters) -> None:
        self.addresses, self.tls = channel_addresses(addresses)
        self.where = ", ".join(f"{host}:{port}" for host, port in self.addresses)
        self.timeout_s = timeout_s
        #: how long a caller waits for a coroutine: an opening may try every address and
        #: follow redirects, each within ``timeout_s``, and then the answer may take as long
        self.wait_s = timeout_s * (2 * len(self.addresses) + 2)
        self.loop = asyncio.new_event_loop()
        self._stats = stats
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._thread = threading.Thread(
            target=self._serve, name="foldplane-relay-upstream", daemon=True
        )
        # The events channels, by whether they carry batches of tokened events; one opening
        # at a time of each.
        self._channels: dict[bool, HostChannel | None] = {True: None, False: None}
        self._links = {
            tokened: ChannelLink(self.addresses, timeout_s=timeout_s, tls=self.tls)
            for tokened in (True, False)
        }
        self._opening = {tokened: asyncio.Lock() for tokened in (True, False)}

    def start(self) -> None:
        with self._lock:
            self._started = True
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def close(self) -> None:
        """Cancel what runs on the loop, close every channel, stop the loop (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if not started:
            self.loop.close()
            return
        done = asyncio.run_coroutine_threadsafe(self._shutdown(), self.loop)
        try:
            done.result(5.0)
        except (TimeoutError, concurrent.futures.CancelledError):
            log.warning("relay: the upstream loop did not stop in time")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)

    async def _shutdown(self) -> None:
        here = asyncio.current_task()
        tasks = [task for task in asyncio.all_tasks() if task is not here]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for channel in self._channels.values():
            if channel is not None:
                channel.close()

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` on the loop until it ends or the relay closes."""
        with self._lock:
            if self._closed:
                coro.close()
                return
            asyncio.run_coroutine_threadsafe(coro, self.loop)

    def call_soon(self, callback: Any) -> None:
        """``callback()`` on the loop, from any thread (nothing once closed)."""
        with self._lock:
            if not self._closed:
                self.loop.call_soon_threadsafe(callback)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result, at most ``wait_s``; raises
        :class:`Unreachable` when it took longer or the relay closed meanwhile."""
        with self._lock:
            if self._closed:
                coro.close()
                raise Unreachable("the relay is shutting down")
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.wait_s)
        except TimeoutError:
            future.cancel()
            raise Unreachable(
                f"no answer from the coordinator at {self.where} within {self.wait_s:g} s"
            ) from None
        except concurrent.futures.CancelledError:
            raise Unreachable("the relay is shutting down") from None

    # -- events (on the loop) --------------------------------------------------------------------

    async def send(self, events: list[Body], door: str | None) -> Body:
        """One batch on the events channel of its kind (tokened when ``door``, a token of the
        batch, is given): the coordinator's answer, ``{"term", "results"}`` or ``{"error",
        "detail"}``. Raises :class:`ChannelRefused` when the opening was refused, and
        :class:`Unreachable`. A ``not_leader`` answer (the batch was not taken) is sent again
        to the leader it names."""
        tokened = door is not None
        for _ in range(len(self.addresses) + 1):
            channel = await self._events_channel(tokened, door)
            try:
                body, _ = await channel.call(events, self.timeout_s)
            except TimeoutError:
                channel.abort()  # the coordinator may be frozen: the next batch opens another
                raise Unreachable(
                    f"no answer from the coordinator at {self.where} within {self.timeout_s:g} s"
                ) from None
            except ChannelClosed as exc:
                raise Unreachable(f"the channel to {self.where} ended: {exc}") from None
            if body.get("error") != NOT_LEADER:
                return body
            channel.close()
            self._links[tokened].follow(body)
        raise Unreachable(f"no coordinator of {self.where} leads")

    async def _events_channel(self, tokened: bool, door: str | None) -> HostChannel:
        """The open events channel of this kind, or a new one (``door`` at its door)."""
        async with self._opening[tokened]:
            channel = self._channels[tokened]
            if channel is not None and channel.closed is None:
                return channel
            link = self._links[tokened]
            if channel is not None:
                link.closed(channel)
                self._channels[tokened] = None
            link.authorization = f"Bearer {door}" if door is not None else None
            try:
                channel = await link.open()
            except (OSError, TimeoutError, ChannelClosed) as exc:
                raise Unreachable(unreachable(self.where, exc)) from None
            self._channels[tokened] = channel
            self._stats.add("events_channels")
            return channel
