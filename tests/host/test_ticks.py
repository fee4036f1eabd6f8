"""The ticker (coordinator/host/ticks.py): its rule alone, then its loop with an injected clock."""

from __future__ import annotations

import asyncio

from foldplane.coordinator.host.inputs import HostUnavailable
from foldplane.coordinator.host.ticks import (
    DEADLINE_MARGIN_S,
    STUCK_WAIT_S,
    Ticker,
    TickNow,
    Wait,
    next_step,
)

S = 1_000_000_000


def test_no_deadline_waits_for_a_change() -> None:
    assert next_step(None, 5 * S, None) == Wait(None)


def test_a_deadline_ahead_waits_until_just_past_it() -> None:
    assert next_step(7 * S, 5 * S, None) == Wait(2 + DEADLINE_MARGIN_S)


def test_a_passed_deadline_gets_a_tick() -> None:
    assert next_step(5 * S, 5 * S + 1, None) == TickNow(5 * S)


def test_a_deadline_a_tick_did_not_move_is_not_ticked_again_at_once() -> None:
    assert next_step(5 * S, 6 * S, 5 * S) == Wait(STUCK_WAIT_S, forget=True)
    # after that wait it may be ticked once more
    assert next_step(5 * S, 6 * S, None) == TickNow(5 * S)


async def test_the_ticker_ticks_once_per_passed_deadline_and_stops_with_the_host() -> None:
    deadlines = [3 * S, 4 * S]
    ticks: list[int] = []
    changed = asyncio.Event()

    async def submit() -> None:
        if len(ticks) == 2:
            raise HostUnavailable("closed", "the coordinator is shutting down")
        ticks.append(deadlines[0])
        deadlines.pop(0)  # the tick moves the deadline on

    def next_deadline() -> int | None:
        return deadlines[0] if deadlines else 2 * S  # the last one does not move any more

    ticker = Ticker(next_deadline, submit, changed, clock=lambda: 10 * S)
    async with asyncio.timeout(5):
        await ticker.run(HostUnavailable)  # returns once submit says the host stopped
    assert ticks == [3 * S, 4 * S]


async def test_the_ticker_waits_for_a_change_instead_of_spinning_on_a_stuck_deadline() -> None:
    ticks: list[int] = []
    changed = asyncio.Event()
    now = [10 * S]

    async def submit() -> None:
        ticks.append(now[0])
        if len(ticks) == 2:
            raise HostUnavailable("closed", "the coordinator is shutting down")

    ticker = Ticker(lambda: 5 * S, submit, changed, clock=lambda: now[0])
    loop = asyncio.get_running_loop()
    started = loop.time()
    async with asyncio.timeout(5):
        await ticker.run(HostUnavailable)
    # one tick, then a wait of STUCK_WAIT_S (no change came), then the deadline once more
    assert len(ticks) == 2
    assert loop.time() - started >= STUCK_WAIT_S * 0.9
