"""``GET /views/history`` and the console's timeline over delta view rows answer exactly what
they answer over full rows: the same bytes, page by page, across a checkpoint.

A real in-process ``Host`` on a SQLite file commits views; the app answers over it in process;
then every view row is rewritten as a full row (a log from before delta rows) and the answers
are read again.
"""

from __future__ import annotations

from foldplane.coordinator.fold.projections import VIEW_CHECKPOINT_EVERY, is_delta
from foldplane.coordinator.host.loop import CONSUMER, Host
from foldplane.coordinator.host.replay import replay_log
from foldplane.coordinator.host.views import every_view
from foldplane.eventlog import ProjectionRow
from tests.retention.history import Life
from tests.service.conftest import asgi_client

K = VIEW_CHECKPOINT_EVERY
LAST = K + 11


async def answers(host: Host) -> list[bytes]:
    """The history page by page (7 at a time, and 10 across the checkpoint), the timeline
    and the current view, as the bytes the app sends."""
    out: list[bytes] = []
    async with asgi_client(host) as client:
        after: int | None = 0
        while after is not None:
            r = await client.get(
                "/views/history", params={"group": "train", "after_version": after, "limit": 7}
            )
            assert r.status_code == 200, r.text
            out.append(r.content)
            after = r.json()["next_after_version"]
        across = await client.get(
            "/views/history", params={"group": "train", "after_version": K - 5, "limit": 10}
        )
        out.append(across.content)
        timeline = await client.get("/ui/api/groups/train/timeline", params={"limit": 30})
        assert timeline.status_code == 200, timeline.text
        out.append(timeline.content)
        out.append((await client.get("/views/current", params={"group": "train"})).content)
    return out


async def test_the_history_over_delta_rows_is_byte_for_byte_the_history_over_full_rows(
    host: Host,
) -> None:
    life = Life(host, world_size=8)
    await life.form()
    await life.view_changes(LAST - 1)
    rows = await host.log.read_projections("view", "train", limit=1000)
    assert [r.seq for r in rows if not is_delta(r.doc)] == [1, K + 1]
    over_deltas = await answers(host)

    # the views in full, as a fresh fold of the log makes them
    views = (await replay_log(host.log)).views
    assert [v["version"] for v in views] == list(range(1, LAST + 1))
    assert [v.doc async for v in every_view(host.log, "train")] == views
    async with asgi_client(host) as client:
        across = await client.get(
            "/views/history", params={"group": "train", "after_version": K - 5, "limit": 10}
        )
    assert across.json() == {
        "group": "train",
        "views": views[K - 5 : K + 5],
        "next_after_version": K + 5,
    }

    # the same log as the host wrote it before delta rows: every row the whole view (the
    # fold's, not the reader's)
    await host.log.write_projections(
        [ProjectionRow("view", "train", v["version"], v) for v in views],
        consumer=CONSUMER,
        offset=await host.log.get_consumer_offset(CONSUMER),
    )
    assert not any(
        is_delta(r.doc) for r in await host.log.read_projections("view", "train", limit=1000)
    )
    assert await answers(host) == over_deltas
