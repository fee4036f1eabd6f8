"""The verdict a refit world reads (``RefitClient.verdict``): what ended an admitted epoch, and
the member it names as dead, read from the epoch updates the agent heard (``lost``, a value the
fold sets, never parsed from the cause's words)."""

from __future__ import annotations

from typing import Any

from foldplane.agent.refit.errors import Peer, Verdict
from foldplane.facets.refits.protocol import RefitEpochUpdate
from foldplane.facets.refits.worker import Admission, RefitClient, RefitTracker


def epoch(n: int, status: str, cause: str, lost: tuple[str, int] | None = None) -> RefitEpochUpdate:
    return RefitEpochUpdate(
        offset=10 * n + (status == "admitted"),
        refit="rl",
        groups=("train", "gen"),
        epoch=n,
        status=status,
        cause=cause,
        deadline_ts=None,
        digest=None,
        lanes=1,
        publisher_ranks=(0, 1) if status == "admitted" else (),
        subscriber_ranks=(0, 1, 2) if status == "admitted" else (),
        missing=(),
        lost=lost,
    )


def admitted(n: int) -> Admission:
    return Admission(
        refit="rl",
        epoch=n,
        lanes=1,
        digest="a" * 64,
        role="subscriber",
        slot=1,
        refit_rank=3,
        world_size=5,
        publisher_ranks=(0, 1),
        subscriber_ranks=(0, 1, 2),
    )


def client(*updates: RefitEpochUpdate) -> RefitClient:
    sent: list[tuple[str, dict[str, Any]]] = []
    tracker = RefitTracker("gen", 1, lambda kind, fields: sent.append((kind, fields)))
    for u in updates:
        tracker.on_update(u)
    return RefitClient(tracker, "rl")


def test_the_epoch_stands_until_a_newer_one_is_heard() -> None:
    c = client(epoch(1, "waiting", "the refit was created"), epoch(1, "admitted", "x"))
    assert c.verdict(admitted(1))() is None


def test_a_lost_member_is_named_from_the_update_s_value() -> None:
    # the cause's words are the operator's; only ``lost`` names the dead (a cause worded
    # otherwise, or naming a slot in passing, changes nothing)
    lost = "publisher slot 0 (train rank 0) is gone, said differently"
    c = client(
        epoch(1, "admitted", "the refit was created"),
        epoch(2, "waiting", lost, lost=("publisher", 0)),
        epoch(3, "waiting", "view 2 of publisher group 'train' committed"),
    )
    verdict = c.verdict(admitted(1))()
    assert verdict == Verdict(
        f"the coordinator moved refit 'rl' from epoch 1 to 2: {lost}", (Peer("publisher", 0),)
    )


def test_an_epoch_moved_by_a_view_names_nobody() -> None:
    c = client(
        epoch(1, "admitted", "the refit was created"),
        epoch(2, "waiting", "subscriber slot 2 (gen rank 2) went OFFLINE, in words only"),
    )
    verdict = c.verdict(admitted(1))()
    assert verdict is not None and verdict.dead == ()


def test_after_a_resync_the_latest_epoch_says_what_it_can() -> None:
    # a resync sends only the latest epoch: epoch 2's first update was never heard
    c = client(epoch(1, "admitted", "created"), epoch(3, "waiting", "lost", lost=("subscriber", 2)))
    verdict = c.verdict(admitted(1))()
    assert verdict is not None
    assert verdict.reason.endswith("from epoch 1 to 3: lost")
    assert verdict.dead == (Peer("subscriber", 2),)
