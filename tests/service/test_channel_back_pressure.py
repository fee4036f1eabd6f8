"""Back pressure on the host channel (``api.channel.HostChannel``), in process: the real
``Host`` on a SQLite file, the channel on a transport that records what it is told. A client
that sends batches without reading the answers, or does not read at all, holds a bounded
amount of the coordinator's memory: the channel stops reading it, and takes up again where it
stopped once the cause is gone; pushes wait for a client that does not read and resume from
the journals. While the channel reads no more of a client, its deadlines do not run against
it (on a test clock, ``tests.service.clock``)."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from foldplane.api.app import create_app
from foldplane.api.channel import MAX_IN_FLIGHT, ChannelQuery, HostChannel
from foldplane.coordinator.auth import OPERATOR
from foldplane.coordinator.host.loop import Appended, Host
from foldplane.eventlog import NewRecord
from foldplane.wire import websocket as ws
from tests.service.clock import Clock

GROUP = "bp"


class Transport:
    """What the channel asks of its transport, recorded; ``wanted`` messages set ``done``."""

    def __init__(self, wanted: int = 0) -> None:
        self.reader = ws.FrameReader(masked=False, max_message=1 << 24)
        self.messages: list[dict[str, Any]] = []
        #: the close frames' codes
        self.closes: list[int] = []
        self.reading = True
        self.pauses = 0
        self.closed = False
        self.wanted = wanted
        self.done = asyncio.Event()

    def write(self, data: bytes) -> None:
        for message in self.reader.feed(data):
            if message.opcode == ws.TEXT:
                self.messages.append(msgspec.json.decode(message.payload))
            elif message.opcode == ws.CLOSE:
                self.closes.append(ws.parse_close(message.payload)[0])
        if self.wanted and len(self.messages) >= self.wanted:
            self.done.set()

    def pause_reading(self) -> None:
        assert self.reading, "paused twice"
        self.reading = False
        self.pauses += 1

    def resume_reading(self) -> None:
        assert not self.reading, "resumed while reading"
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True


FRAME_S = 10.0
IDLE_S = 60.0


def _channel(
    host: Host, transport: Transport, query: ChannelQuery, clock: Clock | None = None
) -> HostChannel:
    channel = HostChannel(
        create_app(host).state,
        OPERATOR,
        query,
        max_message=1 << 20,
        max_depth=32,
        frame_timeout_s=FRAME_S,
        idle_s=IDLE_S,
    )
    if clock is not None:
        channel._loop = clock  # type: ignore[assignment]  # its timers and its "now"
        channel._heard = clock.now
    channel.start(transport, b"")  # type: ignore[arg-type]
    return channel


def _batch(batch_id: int, *events: dict[str, Any]) -> bytes:
    body = msgspec.json.encode({"id": batch_id, "events": list(events)})
    return ws.frame(ws.TEXT, body, mask_key=b"\x01\x02\x03\x04")


async def _group(host: Host) -> None:
    created = await host.submit(
        NewRecord(kind="group_created", group=GROUP, payload={"world_size": 2, "config": {}})
    )
    assert isinstance(created, Appended)


async def test_a_client_that_does_not_read_its_answers_is_read_no_further(host: Host) -> None:
    await _group(host)
    n = 3 * MAX_IN_FLIGHT
    transport = Transport(wanted=n)
    channel = _channel(host, transport, ChannelQuery(None, (), 0, None))
    join = {"type": "join", "group": GROUP, "rank": 0, "incarnation": "a"}
    channel.data_received(b"".join(_batch(i, join) for i in range(n)))  # all of them at once
    # only MAX_IN_FLIGHT of them were taken; the rest wait unread, and so does the socket
    assert host.queue_depth == MAX_IN_FLIGHT
    assert not transport.reading
    async with asyncio.timeout(30):
        await transport.done.wait()  # answered as the host gets through them, in order
    assert [m["id"] for m in transport.messages] == list(range(n))
    assert all("results" in m for m in transport.messages)
    assert transport.reading and transport.pauses >= 2  # held again each time it filled up


async def test_pushes_wait_for_a_client_that_does_not_read_and_resume_from_the_journals(
    host: Host,
) -> None:
    await _group(host)
    transport = Transport()
    channel = _channel(host, transport, ChannelQuery(GROUP, (0, 1), 0, None))
    channel.pause_writing()  # the client stopped reading: its buffer is full
    assert not transport.reading
    joins = [
        NewRecord(kind="join", group=GROUP, rank=r, payload={"incarnation": f"i{r}"})
        for r in (0, 1)
    ]
    assert all(isinstance(o, Appended) for o in await host.submit_many(joins))
    for _ in range(10):
        await asyncio.sleep(0)  # turns of the loop: the journals woke the channel meanwhile
    assert transport.messages == []  # nothing pushed to a client that does not read
    channel.resume_writing()
    assert transport.reading
    [push] = transport.messages  # what it missed, at once, from the journals
    states = [u for u in push["updates"] if u["type"] == "rank_state"]
    assert {u["rank"] for u in states} == {0, 1} and push["resync"] is False


HALF_FRAME = _batch(99, {"type": "heartbeat", "group": GROUP, "rank": 0})[:5]


async def test_while_the_host_is_behind_no_deadline_runs_against_the_client(host: Host) -> None:
    await _group(host)
    clock = Clock(asyncio.get_running_loop())
    transport = Transport(wanted=MAX_IN_FLIGHT)
    channel = _channel(host, transport, ChannelQuery(None, (), 0, None), clock)
    join = {"type": "join", "group": GROUP, "rank": 0, "incarnation": "a"}
    # as many batches as may wait for the host, and half a frame behind them; nothing awaits,
    # so the host answers none of them while the clock runs
    channel.data_received(b"".join(_batch(i, join) for i in range(MAX_IN_FLIGHT)) + HALF_FRAME)
    assert not transport.reading
    clock.advance(IDLE_S + FRAME_S)  # past both deadlines as they stood
    assert transport.closes == [] and not transport.closed
    async with asyncio.timeout(30):
        await transport.done.wait()  # the host answers; the channel reads again
    assert transport.reading
    clock.advance(FRAME_S - 0.5)  # the half frame's time runs again, from where it stood
    assert transport.closes == []
    clock.advance(1.0)
    assert transport.closes == [ws.POLICY_VIOLATION] and transport.closed


async def test_a_client_that_does_not_read_keeps_no_frame_deadline_but_idles_out(
    host: Host,
) -> None:
    await _group(host)
    clock = Clock(asyncio.get_running_loop())
    transport = Transport()
    channel = _channel(host, transport, ChannelQuery(None, (), 0, None), clock)
    channel.data_received(HALF_FRAME)
    channel.pause_writing()  # the client does not read: the channel reads no more of it
    clock.advance(3 * FRAME_S)  # its half frame may be waiting unread in the socket
    assert transport.closes == []
    channel.resume_writing()  # reading again: the frame's deadline is a whole one from here
    clock.advance(FRAME_S - 0.5)
    assert transport.closes == []
    clock.advance(1.0)
    assert transport.closes == [ws.POLICY_VIOLATION]

    silent = Transport()
    channel = _channel(host, silent, ChannelQuery(None, (), 0, None), clock)
    channel.data_received(HALF_FRAME)
    channel.pause_writing()
    clock.advance(IDLE_S - 1.0)
    assert silent.closes == []
    clock.advance(2.0)  # not reading its answers is no reason to send nothing for a minute
    assert silent.closes == [ws.GOING_AWAY]
