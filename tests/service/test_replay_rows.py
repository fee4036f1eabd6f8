"""``replay`` over a group the operator ended, and over the rows earlier versions of foldplane
wrote for the same records (coordinator/host/replay.py: ``ADDED_FIELDS``).

A real in-process ``Host`` on a SQLite file forms a group, commits a view change, and the
operator ends the run; replay must agree with every row the host stored, the ``ended`` row
included. Then the stored rows are rewritten as an earlier version wrote them (a group's config
and the views without ``checkpoint_rank``; the ended run's shutdown naming no checkpoint rank)
and replay still agrees; any other change to a row is a divergence that names it.
"""

from __future__ import annotations

from typing import Any

import pytest

from foldplane.coordinator.host.loop import CONSUMER, Appended, Host
from foldplane.coordinator.host.replay import replay_log
from foldplane.eventlog import NewRecord, ProjectionRow
from tests.retention.history import Life

G = "train"


async def ended_run(host: Host) -> None:
    life = Life(host, G, world_size=4)
    await life.form()
    await life.view_changes(2)
    ended = await host.submit(
        NewRecord(kind="group_ended", group=G, payload={"reason": "the job is done"})
    )
    assert isinstance(ended, Appended)


async def rows(host: Host, kind: str) -> dict[int, dict[str, Any]]:
    return {r.seq: r.doc for r in await host.log.read_projections(kind, G, limit=1000)} | (
        {0: row.doc} if (row := await host.log.get_projection(kind, G, 0)) is not None else {}
    )


async def rewrite(host: Host, kind: str, seq: int, doc: dict[str, Any]) -> None:
    await host.log.write_projections(
        [ProjectionRow(kind, G, seq, doc)],
        consumer=CONSUMER,
        offset=await host.log.get_consumer_offset(CONSUMER),
    )


async def test_a_run_the_operator_ended_replays_with_its_ended_row(host: Host) -> None:
    await ended_run(host)
    assert (await rows(host, "ended"))[0]["reason"] == "the job is done"
    (shutdown,) = (await rows(host, "shutdown")).values()
    assert shutdown["reason"] == "ended" and shutdown["checkpoint_rank"] == 0
    report = await replay_log(host.log)
    assert report.ok, report.divergences

    # the ended row is compared like every other: a changed one is named
    changed = {**(await rows(host, "ended"))[0], "reason": "something else"}
    await rewrite(host, "ended", 0, changed)
    report = await replay_log(host.log)
    assert [d for d in report.divergences if d.startswith("ended train/0 differs")], report


async def test_the_rows_an_earlier_version_wrote_replay_unchanged(host: Host) -> None:
    await ended_run(host)
    group = (await rows(host, "group"))[0]
    config = {k: v for k, v in group["config"].items() if k != "checkpoint_rank"}
    await rewrite(host, "group", 0, {**group, "config": config})
    views = await rows(host, "view")
    for version, doc in views.items():
        await rewrite(
            host, "view", version, {k: v for k, v in doc.items() if k != "checkpoint_rank"}
        )
    ((offset, shutdown),) = (await rows(host, "shutdown")).items()
    await rewrite(host, "shutdown", offset, {**shutdown, "checkpoint_rank": None})
    report = await replay_log(host.log)
    assert report.ok, report.divergences


@pytest.mark.parametrize(
    ("kind", "change", "named"),
    [
        # a shutdown naming another checkpoint rank than the fold's
        ("shutdown", lambda d: {**d, "checkpoint_rank": 3}, "checkpoint_rank: stored 3"),
        # a field always written, emptied or missing
        ("group", lambda d: {**d, "config": {**d["config"], "min_active": None}}, "config"),
        ("group", lambda d: {k: v for k, v in d.items() if k != "offset"}, "offset"),
        # a view naming another checkpoint rank
        ("view", lambda d: {**d, "checkpoint_rank": 2}, "checkpoint_rank"),
    ],
)
async def test_twin_any_other_change_to_a_row_is_a_divergence(
    host: Host, kind: str, change: Any, named: str
) -> None:
    await ended_run(host)
    seq, doc = max((await rows(host, kind)).items())
    await rewrite(host, kind, seq, change(doc))
    report = await replay_log(host.log)
    assert not report.ok
    assert [d for d in report.divergences if d.startswith(f"{kind} {G}/{seq}") and named in d], (
        report.divergences
    )
