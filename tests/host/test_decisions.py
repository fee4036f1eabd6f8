"""The decision log's lines, one per decision, from the fold's effects: wall-clock times
instead of raw nanoseconds, who reported a death, one line for an ending (its
``shutdown_with_save`` is part of it), and the run's start, a join and a clean exit."""

from __future__ import annotations

from foldplane.coordinator.fold.config import GroupConfig
from foldplane.coordinator.fold.effects import GroupCreated, GroupEnded, RankState, ShutdownWithSave
from foldplane.coordinator.fold.state import FINISHED
from foldplane.coordinator.host.decisions import decision

TS = 1_764_406_800_123_456_789  # 2025-11-29 09:00:00.123 UTC


def rank_state(state: str, reason: str) -> RankState:
    return RankState(
        group="g", rank=2, state=state, incarnation="i", rank_epoch=1, reason=reason, offset=9
    )


def test_each_decision_is_one_line_with_wall_clock_times():
    timeout = rank_state(
        "OFFLINE", f"heartbeat timeout: last sign of life at {TS}, deadline {TS + 10**10}"
    )
    assert decision(timeout) == (
        "group g rank 2 lost: heartbeat timeout: last sign of life at 09:00:00.123Z, "
        "deadline 09:00:10.123Z"
    )
    died = rank_state(
        "OFFLINE", "death reported by the launcher on node3 (pid 7 killed by SIGKILL)"
    )
    assert decision(died) == (
        "group g rank 2 lost: death reported by the launcher on node3 (pid 7 killed by SIGKILL)"
    )
    assert decision(rank_state("SYNCED", "joined as incarnation i (rank_epoch 1)")) == (
        "group g rank 2 joined: joined as incarnation i (rank_epoch 1)"
    )
    assert (
        decision(rank_state("OFFLINE", "exited cleanly")) == "group g rank 2 left: exited cleanly"
    )
    assert decision(rank_state("HEALTHY", "in the Healthy Set")) is None  # readiness: quiet
    created = GroupCreated(group="g", config=GroupConfig(world_size=4), offset=3)
    assert decision(created) == "group g created: 4 ranks (run 3)"


def test_an_ending_is_one_line():
    ended = [
        ShutdownWithSave(group="g", reason="ended", detail="rerun", offset=5, checkpoint_rank=0),
        GroupEnded(group="g", reason="rerun", deleted=False, offset=5),
    ]
    assert [decision(e) for e in ended] == [None, "group g ended: rerun"]
    finished = GroupEnded(group="g", reason=FINISHED, deleted=False, offset=8)
    assert decision(finished) == "group g finished: every rank exited cleanly"
    budget = ShutdownWithSave(
        group="g", reason="all_ranks_lost", detail="no rank left", offset=6, checkpoint_rank=None
    )
    assert decision(budget) == "group g shut down (all_ranks_lost): no rank left"  # its own line
