"""Woken long polls answered in shares while inputs wait (coordinator/host/pacing.py), alone."""

from __future__ import annotations

import asyncio

import pytest

from foldplane.coordinator.host.journal import UpdateJournals
from foldplane.coordinator.host.pacing import PollPacing
from foldplane.facets.epochs.protocol import EpochCompleteUpdate


async def woken(journals: UpdateJournals, n: int) -> list[asyncio.Future[None]]:
    """``n`` long polls of group g, woken by one publish."""
    polls = [journals.waiter("g") for _ in range(n)]
    journals.publish_group("g", EpochCompleteUpdate(offset=1, group="g", epoch=0))
    journals.wake()
    return polls


def answered(polls: list[asyncio.Future[None]]) -> int:
    return sum(p.done() for p in polls)


async def test_with_nothing_queued_every_woken_poll_is_answered_at_once() -> None:
    journals = UpdateJournals()
    polls = await woken(journals, 40)
    PollPacing(release=2, spread=4).answer(journals, inputs_waiting=False)
    assert answered(polls) == 40 and journals.releasing == 0


async def test_while_inputs_wait_a_burst_is_spread_over_the_next_batches() -> None:
    journals = UpdateJournals()
    polls = await woken(journals, 40)
    pacing = PollPacing(release=2, spread=4)
    shares = []
    while journals.releasing:
        pacing.answer(journals, inputs_waiting=True)
        shares.append(answered(polls))
    assert shares == [10, 20, 30, 40]  # 40 polls over 4 shares, oldest first
    assert all(p.done() for p in polls[:10])


async def test_a_share_is_at_least_release_polls() -> None:
    journals = UpdateJournals()
    polls = await woken(journals, 5)
    pacing = PollPacing(release=2, spread=8)
    pacing.answer(journals, inputs_waiting=True)
    assert answered(polls) == 2


@pytest.mark.parametrize(("release", "spread"), [(0, 8), (8, 0)])
def test_pacing_needs_at_least_one_poll_and_one_share(release: int, spread: int) -> None:
    with pytest.raises(ValueError, match="poll_release and poll_spread must be at least 1"):
        PollPacing(release=release, spread=spread)
