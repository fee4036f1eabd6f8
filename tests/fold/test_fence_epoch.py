"""``Coordinator.fence_epoch``: it changes whenever a rank input the fold accepted may be refused
now, which is what lets the host skip a waiting heartbeat's second check (batching.py)."""

from __future__ import annotations

from tests.fold.script import Script


def _verdicts(script: Script, group: str, incarnations: list[str], world_size: int) -> dict:
    """What the fold's check says now of a heartbeat from every rank, as every incarnation."""
    return {
        (rank, inc): script.m.check("heartbeat", group, rank, {"incarnation": inc})
        for rank in range(world_size)
        for inc in incarnations
    }


def test_every_change_of_a_heartbeats_verdict_changes_the_epoch() -> None:
    script = Script()
    ws = 3
    steps = [
        ("create", lambda: script.create("g", ws, heartbeat_timeout_s=1.0)),
        *[(f"join {r}", lambda r=r: script.join(r)) for r in range(ws)],
        *[(f"links {r}", lambda r=r: script.links(r)) for r in range(ws)],
        ("ack all", lambda: script.ack_all()),
        ("beat 0", lambda: script.beat(0)),
        ("links 1 down 2", lambda: script.links(1, down=(2,))),
        ("exit 2", lambda: script.exit(2)),
        ("rejoin 2", lambda: script.join(2)),
        ("replace 1", lambda: script.join(1, incarnation="g-1-b")),
        ("death 0", lambda: script.death(0)),
        ("timeout", lambda: (script.at(30.0), script.tick())),
        ("rejoin 0 anew", lambda: script.join(0, incarnation="g-0-b")),
    ]
    incarnations = ["g-0-a", "g-1-a", "g-2-a", "g-1-b", "g-0-b"]
    before = _verdicts(script, "g", incarnations, ws)
    epoch = script.m.fence_epoch("g")
    assert epoch == -1  # no such group yet
    changed = 0
    for name, step in steps:
        step()
        after = _verdicts(script, "g", incarnations, ws)
        now = script.m.fence_epoch("g")
        if after != before:
            changed += 1
            assert now != epoch, f"{name}: a heartbeat's verdict changed, the epoch did not"
        before, epoch = after, now
    assert changed >= 6  # the scenario does change verdicts (joins, exit, replacement, death)


def test_a_failed_formation_changes_the_epoch() -> None:
    script = Script()
    script.create("f", 2, formation_timeout_s=1.0)
    script.join(0, group="f")
    epoch = script.m.fence_epoch("f")
    assert script.m.check("heartbeat", "f", 0, {"incarnation": "f-0-a"}) is None
    script.at(5.0)
    script.tick()
    refused = script.m.check("heartbeat", "f", 0, {"incarnation": "f-0-a"})
    assert refused is not None and refused.code == "group_failed"
    assert script.m.fence_epoch("f") != epoch


def test_heartbeats_and_acks_leave_the_epoch_alone() -> None:
    script = Script()
    script.form("g", 2)
    epoch = script.m.fence_epoch("g")
    script.beat(0)
    script.beat(1)
    script.links(0)
    assert script.m.fence_epoch("g") == epoch
