"""A refit's story (facets/refits/story.py) and the refit part of a rank's story, told
from a scripted log folded by the real fold: a transfer fails when a subscriber dies, the epoch
moves twice (the loss, then the view), the replacement joins and the retry completes."""

from __future__ import annotations

import pytest

from foldplane.coordinator.host.story import StoryBuilder, format_story
from foldplane.facets.refits.story import RefitStoryBuilder, RefitStoryError
from tests.fold.script import Script
from tests.fold.test_refits import (
    D1,
    join_all,
    kill,
    refit_spec,
    report,
    report_all,
    start,
    world,
)


def scenario() -> Script:
    s = world()
    join_all(s)
    t = start(s)
    report(s, "train", 0, t)
    kill(s, "gen", 2, at=3)
    s.at(5).join(2, incarnation="gen-2-b", group="gen")
    s.links(2, group="gen")
    s.propose("activate", [2], group="gen")
    s.ack_all("gen")
    join_all(s)
    report_all(s, start(s))
    return s


def refit_story(s: Script, name: str = "rl") -> dict:
    builder = RefitStoryBuilder(name)
    builder.feed(s.records)
    return builder.result()


def decisions(st: dict) -> list[tuple[str, object]]:
    return [
        (e["event"], e.get("status"))
        for e in st["entries"]
        if e["event"] in ("refit_created", "refit_epoch", "transfer")
    ]


def test_a_refit_s_story_says_why_each_epoch_began_and_what_became_of_each_transfer():
    s = scenario()
    st = refit_story(s)
    assert (st["refit"], st["epoch"], st["status"]) == ("rl", 4, "admitted")
    assert decisions(st) == [
        ("refit_created", None),
        ("refit_epoch", "waiting"),
        ("refit_epoch", "admitted"),
        ("transfer", "running"),
        ("transfer", "failed"),
        ("refit_epoch", "waiting"),
        ("refit_epoch", "waiting"),
        ("refit_epoch", "waiting"),
        ("refit_epoch", "admitted"),
        ("transfer", "running"),
        ("transfer", "completed"),
    ]
    by_event = [e for e in st["entries"] if e["event"] != "refit_join"]
    created = by_event[0]
    assert created["reason"].startswith(
        "refit 'rl' created: publisher group 'train' (2 slots) to subscriber group 'gen' "
        "(4 slots), 4 lanes"
    )
    epochs = [e for e in st["entries"] if e["event"] == "refit_epoch"]
    assert [e["epoch"] for e in epochs] == [1, 1, 2, 3, 4, 4]
    assert epochs[0]["cause"] == "the refit was created"
    assert "all 6 slots joined with digest aaaaaaaaaaaa..." in epochs[1]["reason"]
    assert epochs[1]["digest"] == D1
    assert "subscriber slot 2 (gen rank 2) went OFFLINE" in epochs[2]["reason"]
    assert epochs[3]["cause"] == "view 2 of subscriber group 'gen' committed"
    assert epochs[4]["cause"] == "view 3 of subscriber group 'gen' committed"
    failed = next(e for e in st["entries"] if e.get("status") == "failed")
    assert failed["record"] == "death_reported" and failed["attempt"] == 1
    assert (
        "transfer 'step-1' (#1) attempt 1 failed: subscriber slot 2 (gen rank 2) went OFFLINE"
        in (failed["reason"])
    )
    # every report of each attempt, in order, counting toward completion
    reports = [e for e in st["entries"] if e["event"] == "transfer_status"]
    assert [(e["attempt"], e["status"]) for e in reports] == [(1, "done")] + [(2, "done")] * 6
    assert reports[0]["reason"] == (
        "publisher train rank 0 reported transfer 'step-1' attempt 1 done (1 of 6 done)"
    )
    assert reports[-1]["reason"].endswith("(6 of 6 done)")
    completed = st["entries"][-1]
    assert completed["event"] == "transfer" and completed["status"] == "completed"
    assert completed["offset"] == reports[-1]["offset"]  # the last report completed it
    joins = [e for e in st["entries"] if e["event"] == "refit_join"]
    assert len(joins) == 12 and joins[-1]["reason"].endswith("(6 of 6 slots)")
    assert [e["offset"] for e in st["entries"]] == sorted(e["offset"] for e in st["entries"])
    assert st["summary"] == (
        "refit 'rl' (train -> gen) is at epoch 4, admitted (6 members, digest aaaaaaaaaaaa...); "
        "epoch 4 began: view 3 of subscriber group 'gen' committed; transfer 'step-1' attempt 2 "
        "completed (every slot reported done (attempt 2, epoch 4))"
    )
    text = format_story(st)
    assert "refit_epoch e2 waiting" in text and "transfer completed" in text
    assert text.splitlines()[-1].startswith(f"folded to offset {s.offset}; 0 older evidence")


def test_joins_and_reports_are_bounded_before_each_decision():
    s = scenario()
    builder = RefitStoryBuilder("rl", evidence_limit=2)
    builder.feed(s.records)
    st = builder.result()
    # six joins admit an epoch: only the last two before the admission are kept
    assert len([e for e in st["entries"] if e["event"] == "refit_join"]) == 4
    # four of six joins in each admitted epoch, four of the six reports of attempt 2
    assert st["omitted"]["evidence"] == 4 + 4 + 4
    assert decisions(st) == decisions(refit_story(s))


def test_an_unknown_refit_is_named():
    s = scenario()
    builder = RefitStoryBuilder("nope")
    builder.feed(s.records)
    with pytest.raises(RefitStoryError, match="no refit 'nope' in the log up to offset"):
        builder.result()


def test_a_rank_s_story_has_its_refits_its_place_in_them_and_its_own_reports():
    s = scenario()
    builder = StoryBuilder("train", 1)
    builder.feed(s.records)
    st = builder.result()
    refit = [e for e in st["entries"] if e.get("refit") == "rl"]
    events = [(e["event"], e.get("status")) for e in refit]
    # gen's views and the loss of a gen rank move the epoch in train's story too
    assert events.count(("refit_epoch", "waiting")) == 4
    admitted = [e for e in refit if e["event"] == "refit_epoch" and e["status"] == "admitted"]
    assert [e["epoch"] for e in admitted] == [1, 4]
    assert admitted[0]["reason"].endswith("; rank 1 is publisher slot 1 (refit rank 1)")
    assert [e["event"] for e in refit if e["event"] in ("refit_join", "transfer_status")] == [
        "refit_join",
        "refit_join",
        "transfer_status",
    ]  # its own joins and its one report (rank 0 reported attempt 1, not rank 1)
    assert ("transfer", "failed") in events and events[-1] == ("transfer", "completed")


def test_a_rank_that_is_not_a_member_hears_of_the_refit_over_its_group():
    s = Script()
    s.form("train", world_size=2, heartbeat_timeout_s=3600.0)
    s.form("gen", world_size=5, heartbeat_timeout_s=3600.0)
    s.record("refit_created", None, None, refit_spec())
    join_all(s)
    builder = StoryBuilder("gen", 4)
    builder.feed(s.records)
    st = builder.result()
    admitted = [e for e in st["entries"] if e["event"] == "refit_epoch"][-1]
    assert admitted["status"] == "admitted"
    assert admitted["reason"].endswith("; rank 4 is not a member")
    assert not [e for e in st["entries"] if e["event"] == "refit_join"]


def test_explain_refit_prints_the_story_from_a_log_file(tmp_path):
    import asyncio
    import json
    import subprocess
    import sys

    from foldplane.coordinator.fold import registry
    from foldplane.eventlog import NewRecord, open_log

    s = scenario()

    async def write() -> None:
        log = await open_log(str(tmp_path / "refit.db"))
        log.accept(registry.kinds())  # the refits facet's kinds, which a host hands its log
        try:
            for r in s.records:
                await log.append(
                    [NewRecord(kind=r.kind, group=r.group, rank=r.rank, payload=r.payload, ts=r.ts)]
                )
        finally:
            await log.close()

    asyncio.run(write())

    def explain(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "foldplane.coordinator",
                "explain",
                str(tmp_path / "refit.db"),
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )

    done = explain("--refit", "rl", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == refit_story(s)
    text = explain("--refit", "rl")
    assert text.returncode == 0 and text.stdout.startswith(
        "refit 'rl' (train -> gen) is at epoch 4"
    )
    unknown = explain("--refit", "nope")
    assert unknown.returncode == 2 and "no refit 'nope'" in unknown.stderr
    both = explain("--refit", "rl", "--group", "gen", "--rank", "0")
    assert both.returncode == 2 and "not both" in both.stderr
