"""Stored view rows, full and delta, read back as full views, on a real SQLite file and a real
PostgreSQL: what a real in-process ``Host`` writes over many view changes, read by the one
reader (``coordinator.host.views``), replayed, compacted, tampered with, and rewritten as a log
from before delta rows (every row full).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from foldplane.coordinator.fold import projections
from foldplane.coordinator.fold.effects import ViewCommitted
from foldplane.coordinator.fold.machine import Coordinator
from foldplane.coordinator.fold.projections import (
    DELTA_FROM,
    VIEW_CHECKPOINT_EVERY,
    is_delta,
    view_doc,
    view_of,
)
from foldplane.coordinator.host.compaction import compact_log
from foldplane.coordinator.host.loop import CONSUMER, Host
from foldplane.coordinator.host.replay import replay_log
from foldplane.coordinator.host.retention import RetainPolicy
from foldplane.coordinator.host.views import ViewReader, every_view, get_view, read_views
from foldplane.eventlog import Log, ProjectionRow, open_log
from tests.retention.history import Life

K = VIEW_CHECKPOINT_EVERY
#: view changes after formation: versions 1 .. 2K + 6, across two checkpoints (K+1, 2K+1)
CHANGES = 2 * K + 5
LAST = CHANGES + 1


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def target(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "log.db")
    from tests.eventlog.conftest import schema_url

    pg_url = request.getfixturevalue("pg_url")
    return schema_url(pg_url, request.getfixturevalue("pg_schema"))


async def full_views(log: Log) -> list[dict[str, Any]]:
    """Every committed view of ``train``, in full, from a fresh fold of the whole log."""
    fold, out, after = Coordinator(), [], 0
    while page := await log.read(after, 5000):
        for rec in page:
            out += [view_doc(e.view) for e in fold.step(rec) if isinstance(e, ViewCommitted)]
        after = page[-1].offset
    return out


@pytest.fixture
async def written(target: str) -> AsyncIterator[tuple[Log, list[dict[str, Any]]]]:
    """A log whose group ``train`` (8 ranks) committed ``LAST`` views; the log, opened, and
    the views in full."""
    host = await Host.open(target, snapshot_every=100, heartbeat_flush_s=0)
    try:
        life = Life(host, world_size=8)
        await life.form()
        await life.view_changes(CHANGES)
    finally:
        await host.close()
    log = await open_log(target)
    try:
        views = await full_views(log)
        assert [v["version"] for v in views] == list(range(1, LAST + 1))
        yield log, views
    finally:
        await log.close()


async def raw_rows(log: Log) -> list[ProjectionRow]:
    return await log.read_projections("view", "train", limit=10_000)


async def test_rows_are_deltas_but_every_kth_and_any_version_or_page_reads_as_the_full_views(
    written,
) -> None:
    log, views = written
    rows = await raw_rows(log)
    assert [r.seq for r in rows] == list(range(1, LAST + 1))
    assert [r.seq for r in rows if not is_delta(r.doc)] == [1, K + 1, 2 * K + 1]
    assert all(r.doc[DELTA_FROM] == r.seq - 1 for r in rows if is_delta(r.doc))
    assert [r.doc for r in rows if not is_delta(r.doc)] == [views[0], views[K], views[2 * K]]

    for version in range(1, LAST + 1):
        assert await get_view(log, "train", version) == views[version - 1]
    assert await get_view(log, "train", LAST + 1) is None
    for after in (0, 1, K - 2, K - 1, K, K + 1, 100, 2 * K, LAST - 1, LAST):
        for limit in (1, 10, 100):
            page = await read_views(log, "train", after_version=after, limit=limit)
            assert [v.doc for v in page] == views[after : after + limit], (after, limit)
    # a page that crosses a checkpoint, then the next one from where it ended
    reader = ViewReader(log, "train")
    first = await reader.page(K - 5, 10)
    assert [v.version for v in first] == list(range(K - 4, K + 6))
    assert [v.doc for v in first] == views[K - 5 : K + 5]
    assert [v.doc for v in await reader.page(K + 5, 10)] == views[K + 5 : K + 15]
    assert [s.doc async for s in every_view(log, "train")] == views


async def test_a_page_reads_from_the_checkpoint_before_it_not_the_whole_history(written) -> None:
    log, views = written
    reads: list[tuple[int, int, int]] = []
    real = log.read_projections

    async def counted(kind: str, group: str | None = None, **kw: Any) -> list[ProjectionRow]:
        got = await real(kind, group, **kw)
        reads.append((kw["after_seq"], kw["limit"], len(got)))
        return got

    log.read_projections = counted  # type: ignore[method-assign]
    reader = ViewReader(log, "train")
    page = await reader.page(2 * K + 2, 3)
    assert [v.doc for v in page] == views[2 * K + 2 : 2 * K + 5]
    # from the checkpoint 2K+1 on: the rows before the page and the page, nothing earlier
    assert reads == [(2 * K, 5, 5)]
    reads.clear()
    # going on where a page ended reads only the next rows
    assert [v.doc for v in await reader.page(2 * K + 5, 1)] == [views[2 * K + 5]]
    assert reads == [(2 * K + 5, 1, 1)]
    reads.clear()
    page = await reader.page(K + 30, 100)
    assert [v.doc for v in page] == views[K + 30 :]
    assert min(after for after, _, _ in reads) == K
    assert sum(n for _, _, n in reads) == LAST - K


async def test_replay_verifies_the_rows_and_names_a_corrupted_delta_row(written) -> None:
    log, views = written
    report = await replay_log(log)
    assert report.ok, report.divergences
    assert report.views == views
    rows = {r.seq: r for r in await raw_rows(log)}
    projected = await log.get_consumer_offset(CONSUMER)

    async def put(*rows_: ProjectionRow) -> None:
        await log.write_projections(list(rows_), consumer=CONSUMER, offset=projected)

    # a delta that removes another rank than the fold did
    v = K + 10
    true = rows[v]
    assert is_delta(true.doc)
    wrong_rank = (true.doc["active_ranks"].get("remove") or true.doc["active_ranks"]["add"])[0]
    side = "remove" if "remove" in true.doc["active_ranks"] else "add"
    forged = {**true.doc, "active_ranks": {side: [wrong_rank % 7 + 1]}}
    assert forged != true.doc
    await put(ProjectionRow("view", "train", v, forged))
    report = await replay_log(log)
    assert report.divergences == [
        f"view train/{v} differs: active_ranks: stored {forged['active_ranks']!r}, "
        f"replayed {true.doc['active_ranks']!r}"
    ]
    # a delta from a version it does not follow: the rows do not fold from there on
    await put(true, ProjectionRow("view", "train", v, {**true.doc, DELTA_FROM: v - 2}))
    report = await replay_log(log)
    assert not report.ok
    assert any("do not fold" in d and f"train/{v}" in d for d in report.divergences)
    assert any(d.startswith(f"view train/{v} differs: delta_from") for d in report.divergences)
    # a delta where a checkpoint's full row belongs
    delta = {**rows[K + 2].doc, DELTA_FROM: K, "version": K + 1}
    await put(true, ProjectionRow("view", "train", K + 1, delta))
    report = await replay_log(log)
    assert any(
        d.startswith(f"view train/{K + 1} is stored as a delta from version {K}")
        for d in report.divergences
    )
    # the twin: the rows as written replay clean again
    await put(true, rows[K + 1])
    assert (await replay_log(log)).ok


async def test_a_log_of_only_full_rows_reads_and_replays_the_same(written) -> None:
    log, views = written
    before = [v.doc for v in await read_views(log, "train", after_version=K - 3, limit=7)]
    projected = await log.get_consumer_offset(CONSUMER)
    # what the host wrote before delta rows existed: every version's whole view
    await log.write_projections(
        [ProjectionRow("view", "train", v["version"], v) for v in views],
        consumer=CONSUMER,
        offset=projected,
    )
    assert not any(is_delta(r.doc) for r in await raw_rows(log))
    assert [s.doc async for s in every_view(log, "train")] == views
    assert [v.doc for v in await read_views(log, "train", after_version=K - 3, limit=7)] == before
    report = await replay_log(log)
    assert report.ok, report.divergences
    assert report.views == views
    # a tampered full row is still named
    forged = {**views[4], "active_ranks": [0]}
    await log.write_projections(
        [ProjectionRow("view", "train", 5, forged)], consumer=CONSUMER, offset=projected
    )
    report = await replay_log(log)
    assert report.divergences == [
        f"view train/5 differs: active_ranks: stored [0], replayed {views[4]['active_ranks']!r}"
    ]


async def test_compaction_keeps_every_view_row_and_a_replay_after_it_reads_them(written) -> None:
    log, views = written
    rows = await raw_rows(log)
    report = await compact_log(log, RetainPolicy(keep_records=0), step_records=50)
    assert report.ok, report.divergences
    assert report.removed > 0
    assert await raw_rows(log) == rows  # no view row removed or rewritten: deltas keep bases
    assert [s.doc async for s in every_view(log, "train")] == views
    again = await replay_log(log)
    assert again.ok, again.divergences
    assert again.start.offset > 0 and again.views == views


async def test_a_delta_where_a_checkpoint_belongs_is_read_from_the_full_row_before_it(
    written, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, views = written
    # the rows of versions K and K+1 as a writer with other checkpoints would store them
    with monkeypatch.context() as patched:
        patched.setattr(projections, "VIEW_CHECKPOINT_EVERY", 10 * K)
        row = projections.view_row(view_of(views[K]), view_of(views[K - 1]))
    assert is_delta(row.doc) and row.seq == K + 1
    projected = await log.get_consumer_offset(CONSUMER)
    await log.write_projections([row], consumer=CONSUMER, offset=projected)
    # a read after the checkpoint finds a delta there and starts a checkpoint further back
    for after in (K, K + 1, K + 2):
        page = await read_views(log, "train", after_version=after, limit=5)
        assert [v.doc for v in page] == views[after : after + 5]
    assert [s.doc async for s in every_view(log, "train")] == views
