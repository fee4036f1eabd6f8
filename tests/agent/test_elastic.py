"""End to end: a real coordinator server, real worker processes (gloo on CPU), real failures.

What Mooncake's elastic tests cover, on foldplane: a rank SIGKILLed mid-run, recovery by a
replacement that every survivor proposes to activate, a graceful self-deactivation, an in-place
rejoin after a transient link failure, manual mode, and collectives with holes in the active set.
"""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ALL = [0, 1, 2, 3]


def formed(w) -> None:
    """Wait until every worker started and view 1 over all ranks is installed everywhere."""
    for r in ALL:
        w.expect(r, "started")
    views = w.ask(ALL, "wait_view", "view", active=ALL)
    assert {v["version"] for v in views.values()} == {1}


def test_sigkill_mid_run_survivors_continue_on_the_new_view_and_the_hint_names_the_dead_rank(
    workers, coordinator
):
    w = workers("kill", 4)
    formed(w)
    first = w.ask(ALL, "all_reduce", "all_reduce")
    assert all(res["ok"] and res["value"] == 10.0 for res in first.values()), str(first)

    # The survivors issue an all_reduce that cannot complete without rank 3; then it dies.
    w.send([0, 1, 2], "all_reduce")
    for r in (0, 1, 2):
        assert w.expect(r, "issued")["version"] == 1
    w.launcher.kill(3)
    death = w.exits.get(timeout=30)
    assert (death.rank, death.returncode, death.reported) == (3, -9, True), death

    failed = {r: w.expect(r, "all_reduce") for r in (0, 1, 2)}
    for r, res in failed.items():
        assert res["ok"] is False, (r, res)
        assert res["hint"] == [0, 0, 0, 1], (r, res)

    w.ask([0, 1, 2], "wait_view", "view", active=[0, 1, 2])
    after = w.ask([0, 1, 2], "all_reduce", "all_reduce")
    for r, res in after.items():
        assert res["ok"] and res["value"] == 6.0 and res["version"] == 2, (r, res)
        assert res["hint"] == [0, 0, 0, 0]

    history = coordinator.history("kill")
    assert [(v["version"], v["active_ranks"]) for v in history] == [(1, ALL), (2, [0, 1, 2])]
    assert history[1]["cause"]["kind"] == "auto_deactivation"


def test_a_replacement_is_activated_once_while_every_survivor_proposes_it(workers, coordinator):
    w = workers("recover", 4)
    formed(w)
    w.launcher.kill(3)
    assert w.exits.get(timeout=30).reported
    w.ask([0, 1, 2], "wait_view", "view", active=[0, 1, 2])

    w.spawn(3)
    w.expect(3, "started")
    outcomes = w.ask([0, 1, 2], "activate", "proposal", ranks=[3])
    assert {o["status"] for o in outcomes.values()} == {"applied"}, outcomes
    assert {o["version"] for o in outcomes.values()} == {3}, outcomes
    assert len({o["id"] for o in outcomes.values()}) == 3  # three proposals, one view change

    w.ask(ALL, "wait_view", "view", active=ALL, min_version=3)
    res = w.ask(ALL, "all_reduce", "all_reduce")
    assert all(r["ok"] and r["value"] == 10.0 and r["version"] == 3 for r in res.values()), res
    versions = [(v["version"], v["active_ranks"]) for v in coordinator.history("recover")]
    assert versions == [(1, ALL), (2, [0, 1, 2]), (3, ALL)]


def test_a_rank_deactivates_itself_leaves_cleanly_and_is_replaced(workers, coordinator):
    w = workers("graceful", 4)
    formed(w)
    out = w.ask([2], "deactivate", "proposal", ranks=[2])[2]
    assert (out["status"], out["version"], out["view_version"]) == ("applied", 2, 2), out
    w.ask([0, 1, 3], "wait_view", "view", active=[0, 1, 3])
    w.send(2, "close")
    assert w.expect(2, "closed")["stopped"] == "closed"
    leave = w.exits.get(timeout=30)
    assert (leave.rank, leave.returncode, leave.reported) == (2, 0, False)  # not a death
    rank2 = coordinator.rank("graceful", 2)
    assert rank2["state"] == "OFFLINE" and rank2["exited"] is True, rank2

    res = w.ask([0, 1, 3], "all_reduce", "all_reduce")
    assert all(r["ok"] and r["value"] == 7.0 for r in res.values()), res

    w.spawn(2)
    w.expect(2, "started")
    assert w.ask([0], "activate", "proposal", ranks=[2])[0]["status"] == "applied"
    w.ask(ALL, "wait_view", "view", active=ALL, min_version=3)
    res = w.ask(ALL, "all_reduce", "all_reduce")
    assert all(r["ok"] and r["value"] == 10.0 for r in res.values()), res


def test_in_place_rejoin_after_a_transient_link_failure(workers, coordinator):
    w = workers("rejoin", 4)
    formed(w)
    w.ask([1], "inject_link_failure", "injected", peer=2)
    res = w.ask(ALL, "all_reduce", "all_reduce")
    assert not any(r["ok"] for r in res.values()), res
    assert res[1]["hint"] == [0, 0, 1, 0] and res[2]["hint"] == [0, 1, 0, 0], res

    # The link 1-2 is down: the largest fully connected set keeps 0, 1, 3 (the smaller ranks).
    w.ask([0, 1, 3], "wait_view", "view", active=[0, 1, 3])
    ok = w.ask([0, 1, 3], "all_reduce", "all_reduce")
    assert all(r["ok"] and r["value"] == 7.0 for r in ok.values()), ok

    # The link is back: rank 2 rejoins in place (same process, same incarnation) and is activated.
    w.ask([2], "rejoin", "rejoining")
    w.ask([2], "wait_state", "state", state="HEALTHY")
    assert w.ask([0], "activate", "proposal", ranks=[2])[0]["status"] == "applied"
    w.ask(ALL, "wait_view", "view", active=ALL, min_version=3)
    res = w.ask(ALL, "all_reduce", "all_reduce")
    assert all(r["ok"] and r["value"] == 10.0 for r in res.values()), res
    rank2 = coordinator.rank("rejoin", 2)
    assert rank2["rank_epoch"] == 1  # the same incarnation throughout


def test_manual_mode_reports_hints_and_leaves_active_ranks_to_the_upper_layer(workers, coordinator):
    w = workers("manual", 4, auto_deactivate_on_failure=False)
    formed(w)
    w.ask([0], "inject_link_failure", "injected", peer=1)
    res = w.ask(ALL, "all_reduce", "all_reduce")
    assert res[0]["hint"] == [0, 1, 0, 0] and res[2]["hint"] == [0, 1, 0, 0], res
    assert res[1]["hint"] == [1, 0, 0, 0], res

    # Rank 1 leaves the Healthy Set, but nothing changes active_ranks on its own.
    w.ask([1], "wait_state", "state", state="SYNCED")
    info = coordinator.status("manual")
    assert info["view"]["version"] == 1 and info["view"]["active_ranks"] == ALL, info
    assert info["change_in_flight"] is None, info
    assert w.ask([1], "all_reduce", "all_reduce")[1]["ok"] is False  # fails fast until a new view

    out = w.ask([0], "deactivate", "proposal", ranks=[1])[0]
    assert (out["status"], out["version"]) == ("applied", 2), out
    w.ask(ALL, "wait_view", "view", active=[0, 2, 3])
    ok = w.ask([0, 2, 3], "all_reduce", "all_reduce")
    assert all(r["ok"] and r["value"] == 8.0 for r in ok.values()), ok
    inactive = w.ask([1], "all_reduce", "all_reduce")[1]
    assert inactive["ok"] and inactive["value"] == 2.0  # an inactive rank's op completes locally

    w.ask([1], "rejoin", "rejoining")
    w.ask([1], "wait_state", "state", state="HEALTHY")
    assert w.ask([2], "recover", "proposal", ranks=[1])[2]["status"] == "applied"
    w.ask(ALL, "wait_view", "view", active=ALL, min_version=3)
    res = w.ask(ALL, "all_reduce", "all_reduce")
    assert all(r["ok"] and r["value"] == 10.0 for r in res.values()), res


def test_collectives_with_holes_in_the_active_set_and_p2p_to_a_dead_rank(workers, coordinator):
    w = workers("holes", 4)
    formed(w)
    assert w.ask([0], "deactivate", "proposal", ranks=[1])[0]["status"] == "applied"
    w.ask(ALL, "wait_view", "view", active=[0, 2, 3])

    gathered = w.ask(ALL, "all_gather", "all_gather")
    for r in (0, 2, 3):
        assert gathered[r]["ok"] and gathered[r]["value"] == [1.0, -1.0, 3.0, 4.0], gathered
    assert gathered[1]["ok"] and gathered[1]["value"] == [-1.0] * 4  # inactive: untouched

    scattered = w.ask(ALL, "reduce_scatter", "reduce_scatter")
    for r in (0, 2, 3):
        # out[r] = sum over active a of (10 a + r) = 10 (0 + 2 + 3) + 3 r
        assert scattered[r]["ok"] and scattered[r]["value"] == 50.0 + 3 * r, scattered
    assert scattered[1]["value"] == -1.0

    w.send(0, "send", dst=2)
    got = w.ask([2], "recv", "recv", src=0)[2]
    assert got["ok"] and got["value"] == 1.0
    assert w.expect(0, "send")["ok"]

    w.launcher.kill(3)
    assert w.exits.get(timeout=30).rank == 3
    sent = w.ask([0], "send", "send", dst=3)[0]
    assert sent["ok"] is False and sent["hint"] == [0, 0, 0, 1], sent
