"""The operator's console (``GET /ui``) in a real headless browser, against a real coordinator
and a real group of simulated agents.

The browser is the system's Chromium (``/usr/bin/chromium``, from Debian's packages; ``.ci/run``
installs it when it is missing), driven by Playwright's Python package, which never downloads a
browser here: it is pointed at the system binary. The tests read the heat map's pixels, so "the
grid shows the right states" means what a person would see.

Set ``FOLDPLANE_SCREENSHOT=docs/console.png`` to keep the screenshot the README shows.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from foldplane.agent.simhost import SimulatedCluster
from tests.service.conftest import FAST, ROOT, Server, make_server

CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if os.access(p, os.X_OK)),
    shutil.which("chromium"),
)
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium at /usr/bin/chromium: apt-get install chromium (.ci/run does)",
)
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
OPERATOR = "console-operator-token"
#: The heat map's colours for (state code, active), as a person sees them (see console.html).
HEALTHY, SYNCED, OFFLINE = "H", "S", "O"
#: A long heartbeat timeout: only the death report takes a rank out, however loaded the machine.
CALM = {**FAST, "heartbeat_timeout_s": 60.0}


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    from playwright.async_api import async_playwright

    async with async_playwright() as pw:
        b = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        try:
            yield b
        finally:
            await b.close()


@pytest.fixture
def console_server(tmp_path: Path):
    srv = make_server(tmp_path).start()
    yield srv
    srv.stop()


async def _pixel(page: Any, rank: int) -> list[int]:
    return await page.evaluate(
        """(rank) => {
            const c = document.getElementById('grid');
            const p = window.fpConsole.cellCentre(rank);
            return Array.from(c.getContext('2d').getImageData(p.x, p.y, 1, 1).data.slice(0, 3));
        }""",
        rank,
    )


async def _colour(page: Any, code: str, active: bool) -> list[int]:
    return await page.evaluate("([c, a]) => window.fpConsole.colour(c, a)", [code, active])


async def _until(page: Any, expression: str, timeout: float = 20) -> None:
    """Poll a JS expression until it is true (the page's CSP forbids the eval behind
    Playwright's wait_for_function, and it should: the test runs the page as served)."""
    async with asyncio.timeout(timeout):
        while not await page.evaluate(f"() => Boolean({expression})"):
            await page.wait_for_timeout(50)


async def _rows(page: Any, table: str) -> list[list[str]]:
    """The cells' text of every body row of ``table``, read in one evaluation (reading row by
    row through locators could straddle a re-render of the table)."""
    return await page.evaluate(
        f"() => [...document.querySelectorAll('{table} tbody tr')]"
        ".map((tr) => [...tr.cells].map((td) => td.textContent))"
    )


#: the number of the newest decision the data panel's changes table shows
_FIRST_CHANGE = "document.querySelector('#d-changes tbody tr td')?.textContent"


async def _wait_pixel(page: Any, rank: int, code: str, active: bool, timeout: float = 20) -> None:
    want = await _colour(page, code, active)
    async with asyncio.timeout(timeout):
        while (got := await _pixel(page, rank)) != want:
            await page.wait_for_timeout(50)
    assert got == want


async def test_the_console_shows_the_group_and_a_kill_live(console_server: Server, browser):
    """32 ranks: 31 form the group, rank 31 joins but never reports its links (SYNCED, left
    out); a proposal deactivates rank 30, a malformed one is rejected, then rank 5 is killed.
    The page shows each step as it happens, without a reload."""
    srv = console_server
    world = 32
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        r = await client.post(
            "/groups", json={"group": "train", "world_size": world, "min_ranks": 31, **CALM}
        )
        assert r.status_code == 201, r.text
        address = ("127.0.0.1", srv.port)
        sim = SimulatedCluster(address, "train", world, ranks=list(range(31)))
        # rank 31 joins, but its data plane never becomes ready: it stays SYNCED, left out
        laggard = SimulatedCluster(address, "train", world, ranks=[31], data_plane_ready=False)
        await sim.start()
        await laggard.start()
        try:
            await sim.wait_until(lambda: sim.all_on(1), timeout=30)
            page = await browser.new_page(viewport={"width": 1400, "height": 1000})
            requested: list[str] = []
            page.on("request", lambda req: requested.append(req.url))
            await page.goto(srv.url + "/ui")
            await _until(page, "document.getElementById('g-version').textContent === '1'")
            # self-contained: everything it loads comes from the coordinator itself
            assert requested and all(u.startswith(srv.url + "/") for u in requested), requested
            # the colours of the states differ, so a pixel tells them apart
            colours = {
                (c, a): await _colour(page, c, a)
                for c in (HEALTHY, SYNCED, OFFLINE)
                for a in (True, False)
            }
            assert len({tuple(c) for c in colours.values()}) == 6
            for rank in range(31):
                assert await _pixel(page, rank) == colours[(HEALTHY, True)], rank
            assert await _pixel(page, 31) == colours[(SYNCED, False)]
            assert await page.text_content("#n-HEALTHY") == "31"
            assert await page.text_content("#n-SYNCED") == "1"
            await page.evaluate("window.__same_page = 'not reloaded'")

            # an epoch plan: each of the 31 active ranks holds 1,000 positions of it
            assert await page.is_visible("#d-none")
            plan = await client.post(
                "/groups/train/epochs", json={"epoch": 0, "dataset_size": 31_000, "seed": 5}
            )
            assert plan.status_code == 201, plan.text
            await _until(page, "document.querySelectorAll('#d-ranks tbody tr').length === 31")
            assert await page.text_content("#d-status") == "open"
            assert await page.text_content("#d-processed") == "0 of 31,000 (0.0%)"
            first = await page.locator("#d-ranks tbody tr").first.locator("td").all_text_contents()
            assert first[:4] == ["0", "1,000", "0", "1,000"] and first[5] == "0..999"
            assert "shuffled with seed 5" in await page.text_content("#d-how")

            # a scheduler takes rank 30 out; a malformed proposal is logged and rejected
            out = await client.post(
                "/proposals",
                params={"wait": 15},
                json={"group": "train", "op": "deactivate", "ranks": [30], "proposer": "scheduler"},
            )
            assert out.json()["status"] == "applied", out.text
            bad = await client.post(
                "/proposals",
                params={"wait": 15},
                json={"group": "train", "op": "activate", "ranks": [99], "proposer": "typo"},
            )
            assert bad.json()["status"] == "rejected", bad.text
            await _wait_pixel(page, 30, HEALTHY, False)
            await _until(page, "document.querySelectorAll('#proposals tbody tr').length === 2")
            proposals = await _rows(page, "#proposals")
            assert [(p[1], p[2], p[3], p[4]) for p in proposals] == [
                ("activate", "[99]", "typo", "rejected"),
                ("deactivate", "[30]", "scheduler", "applied"),
            ]
            assert "99" in proposals[0][6] and proposals[1][5] == "2"

            # click rank 5's cell: its story so far
            box = await page.locator("#grid").bounding_box()
            centre = await page.evaluate("window.fpConsole.cellCentre(5)")
            dpr = await page.evaluate("window.devicePixelRatio")
            await page.mouse.click(box["x"] + centre["x"] / dpr, box["y"] + centre["y"] / dpr)
            await _until(
                page,
                "document.getElementById('story-summary').textContent"
                ".startsWith(\"rank 5 of 'train' is HEALTHY, in active_ranks of version 2\")",
            )

            # rank 5 dies: the launcher reports it, and the page follows the stream
            sim.kill(5)
            died = await client.post(
                "/agents/deaths",
                json={"group": "train", "rank": 5, "reporter": "launcher@node3"},
            )
            assert died.status_code == 200, died.text
            await sim.wait_until(lambda: sim.all_on(3), timeout=30)
            await _wait_pixel(page, 5, OFFLINE, False)
            await _until(page, "document.getElementById('g-version').textContent === '3'")
            for rank in (*range(5), *range(6, 30)):
                assert await _pixel(page, rank) == colours[(HEALTHY, True)], rank
            assert await page.evaluate("window.__same_page") == "not reloaded"
            navigations = await page.evaluate("performance.getEntriesByType('navigation').length")
            assert navigations == 1
            assert await page.text_content("#n-OFFLINE") == "1"
            assert await page.text_content("#g-active") == "29"
            # the mouse still rests on rank 5's cell: its caption followed too
            assert await page.text_content("#hover") == "rank 5: OFFLINE, not in active_ranks"
            assert await page.text_content("#g-budget") == (
                "1 failed (no max_failure) · backend gloo needs 1"
            )

            # the timeline names what left and why, newest first
            rows = await _rows(page, "#timeline")
            assert [(r[0], r[2], r[3], r[4]) for r in rows] == [
                ("v3", "auto_deactivation", "29", "[5]"),
                ("v2", f"proposal {out.json()['id']}", "30", "[30]"),
                ("v1", "formation", "31", "–"),
            ]
            assert "5 OFFLINE" in rows[0][6]

            # the data plan followed both departures: what ranks 30 and 5 held went to the
            # others, each move a committed decision, newest first
            # the changes table is fetched after the plan it explains: wait for its newest row
            await _until(page, _FIRST_CHANGE + " === '3'")
            changes = await _rows(page, "#d-changes")
            assert [(c[0], c[1], c[2]) for c in changes] == [
                ("3", "v3", "view_committed"),
                ("2", "v2", "view_committed"),
                ("1", "v1", "planned"),
            ]
            assert changes[0][3].startswith("5 → 0: ") and "rank 5 left the view" in changes[0][4]
            assert changes[1][3].startswith("30 → 0: ") and "rank 30 left" in changes[1][4]
            assert changes[2][3] == "epoch 0 split over 31 ranks"
            epoch = (await client.get("/groups/train/epochs")).json()
            shown = {int(r[0]): (r[1], r[3]) for r in await _rows(page, "#d-ranks")}
            for r in epoch["ranks"]:
                held = r["held"]
                left = sum(n for _, n in r["remaining"])
                assert shown[r["rank"]] == (f"{held:,}", f"{left:,}"), r
            assert shown[5] == ("0", "0") and shown[30] == ("0", "0")

            # the story on show followed the kill: it names the death report and the view that
            # removed the rank
            await _until(
                page,
                "document.getElementById('story-summary').textContent"
                ".startsWith(\"rank 5 of 'train' is OFFLINE, outside active_ranks of version 3\")",
            )
            rows = await _rows(page, "#story-table")
            events = [r[2] for r in rows]
            death = events.index("death_reported → rank_state OFFLINE")
            assert rows[death][3] == "death reported by launcher@node3"
            removed = next(r for r in rows if r[2].endswith("→ view_committed v3"))
            assert "outside active_ranks (auto_deactivation" in removed[3]
            assert rows.index(removed) > death

            shot = Path(os.environ.get("FOLDPLANE_SCREENSHOT") or srv.db.parent / "console.png")
            if not shot.is_absolute():
                shot = ROOT / shot
            await page.screenshot(path=str(shot), full_page=True)
            assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        finally:
            await sim.stop()
            await laggard.stop()


async def test_the_grid_stays_readable_at_16384_ranks(console_server: Server, browser):
    srv = console_server
    async with httpx.AsyncClient(base_url=srv.url, timeout=60) as client:
        r = await client.post("/groups", json={"group": "wide", "world_size": 16_384, **CALM})
        assert r.status_code == 201, r.text
        joins = [
            {"type": "join", "group": "wide", "rank": rank, "incarnation": f"w-{rank}"}
            for rank in (5, 16_383)
        ]
        results = (await client.post("/agents/events", json={"events": joins})).json()["results"]
        assert all("offset" in res for res in results), results
    page = await browser.new_page(viewport={"width": 1400, "height": 1000})
    await page.goto(srv.url + "/ui#wide")
    await _until(page, "document.getElementById('g-title').textContent.includes('16384')")
    layout = await page.evaluate("window.fpConsole.layout")
    # cells a person can point at (docs/console.md: cells 5 px apart in this window)
    assert layout["n"] == 16_384 and layout["cell"] >= 5
    size = await page.locator("#grid").bounding_box()
    assert size["width"] <= 900 and size["height"] <= 900  # the whole group on one screen
    # one canvas, not an element per rank
    assert await page.evaluate("document.getElementsByTagName('*').length") < 1000
    synced = await _colour(page, SYNCED, False)
    offline = await _colour(page, OFFLINE, False)
    assert await _pixel(page, 5) == synced and await _pixel(page, 16_383) == synced
    assert await _pixel(page, 0) == offline and await _pixel(page, 16_382) == offline
    assert await page.text_content("#n-SYNCED") == "2"
    await page.screenshot(path=str(srv.db.parent / "console-16384.png"))


@pytest.fixture
def secure_console(tmp_path: Path):
    srv = make_server(tmp_path, env={"FOLDPLANE_TOKEN": OPERATOR, "FOLDPLANE_SECRET": ""})
    srv.start()
    yield srv
    srv.stop()


async def test_with_auth_on_the_page_shows_nothing_of_a_group_without_the_token(
    secure_console: Server, browser
):
    srv = secure_console
    op = {"Authorization": f"Bearer {OPERATOR}"}
    r = httpx.post(
        srv.url + "/groups",
        json={"group": "secret-train", "world_size": 2, **CALM},
        headers=op,
    )
    assert r.status_code == 201, r.text
    # every read the page makes needs the operator token (but the group reads, GET
    # /groups/{group} and /groups/{group}/epochs, which are open: docs/protocol.md), and the
    # page makes none of those before the overview answered
    for path in (
        "/ui/api/overview",
        "/ui/api/groups/secret-train",
        "/ui/api/groups/secret-train/timeline",
        "/ui/api/groups/secret-train/epochs/changes",
        "/groups/secret-train/ranks/0/story",
        "/events",
        "/events/stream",
    ):
        assert httpx.get(srv.url + path).status_code == 401, path
        wrong = httpx.get(srv.url + path, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 403, path
    assert httpx.get(srv.url + "/ui/api/overview", headers=op).status_code == 200

    page = await browser.new_page()
    urls: list[str] = []
    page.on("request", lambda req: urls.append(req.url))
    await page.goto(srv.url + "/ui")
    await page.wait_for_selector("#login:not(.hidden)", timeout=20_000)
    assert await page.is_hidden("#app")
    assert "secret-train" not in await page.content()
    assert "secret-train" not in (await page.inner_text("body"))

    await page.fill("#token", "a-wrong-token")
    await page.click("#login-form button")
    await _until(page, "document.getElementById('login-error').textContent.includes('refused')")
    assert "secret-train" not in await page.content()

    await page.fill("#token", OPERATOR)
    await page.click("#login-form button")
    await page.wait_for_selector("#app:not(.hidden)", timeout=20_000)
    await _until(page, "document.getElementById('g-title').textContent.includes('secret-train')")
    await _until(page, "document.getElementById('live').textContent === 'live'")
    assert urls and all(OPERATOR not in u and "a-wrong-token" not in u for u in urls)


async def test_the_data_plan_shows_progress_and_moves_live(tmp_path: Path, browser):
    """Real agents read an epoch on ``ElasticSampler`` (tests/service/epoch_scenario.py): the
    panel shows each rank's processed and remaining as the coordinator accepts them, rank 1's
    departure and return as moves, and the epoch's end, without a reload."""
    from tests.service.epoch_scenario import FIRST, SIZE, EpochScenario

    srv = make_server(tmp_path, store=True).start()
    scenario = EpochScenario(srv.url)
    try:
        await asyncio.to_thread(scenario.start)
        page = await browser.new_page(viewport={"width": 1400, "height": 1000})
        await page.goto(srv.url + "/ui#data")
        await _until(page, "document.querySelectorAll('#d-ranks tbody tr').length === 4")
        await asyncio.to_thread(scenario.read, FIRST)
        await _until(
            page,
            f"document.getElementById('d-processed').textContent.startsWith('{sum(FIRST.values()):,} of')",
        )

        async def ranks() -> dict[int, list[str]]:
            rows = await _rows(page, "#d-ranks")
            return {int(r[0]): r for r in rows}

        shown = await ranks()
        for rank, n in FIRST.items():
            assert shown[rank][2] == f"{n:,}" and shown[rank][3] == f"{SIZE // 4 - n:,}"
        width = await page.evaluate(
            "document.querySelector('#d-ranks tbody tr:nth-child(4) .bar span').style.width"
        )
        assert width == f"{100 * FIRST[3] // (SIZE // 4)}%"  # 350 of 1,000

        await asyncio.to_thread(scenario.leave_and_return_after_reading)
        await _until(page, _FIRST_CHANGE + " === '3'")
        changes = await _rows(page, "#d-changes")
        assert [c[1] for c in changes] == ["v3", "v2", "v1"]
        assert changes[1][3] == "1 → 0: 250, 1 → 2: 250, 1 → 3: 250"
        assert "rank 1 joined" in changes[0][4] and changes[0][3].count("→ 1:") == 3
        await page.evaluate("window.__same_page = 'not reloaded'")

        await asyncio.to_thread(scenario.finish)
        await _until(page, "document.getElementById('d-status').textContent === 'complete'")
        assert await page.text_content("#d-processed") == f"{SIZE:,} of {SIZE:,} (100.0%)"
        shown = await ranks()
        assert all(r[3] == "0" for r in shown.values())
        assert sum(int(r[2].replace(",", "")) for r in shown.values()) == SIZE
        assert await page.evaluate("window.__same_page") == "not reloaded"
    finally:
        await asyncio.to_thread(scenario.close)
        srv.stop()


async def test_the_refit_panel_shows_epochs_members_and_transfers_live(
    console_server: Server, browser
):
    """A refit driven over HTTP (tests/service/test_refits_api.py's events, a real server): the
    panel shows it waiting, then admitted with its members, a transfer that fails naming who
    said so, and its retry completing, without a reload."""
    srv = console_server

    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:

        async def send(group: str, rank: int, kind: str, **fields: Any) -> dict:
            event = {"type": kind, "group": group, "rank": rank, "incarnation": f"{group}-{rank}"}
            r = await c.post("/agents/events", json={"events": [{**event, **fields}]})
            assert r.status_code == 200, r.text
            result = r.json()["results"][0]
            assert "offset" in result, result
            return result

        for group, size in (("train", 2), ("gen", 4)):
            r = await c.post("/groups", json={"group": group, "world_size": size, **CALM})
            assert r.status_code == 201, r.text
            for rank in range(size):
                await send(group, rank, "join")
            for rank in range(size):
                await send(group, rank, "links", self_ready=True)
            version = (await c.get(f"/groups/{group}")).json()["change_in_flight"]["version"]
            for rank in range(size):
                await send(group, rank, "ack", version=version)
        spec = {
            "refit": "rl",
            "publisher": "train",
            "subscriber": "gen",
            "publisher_slots": 2,
            "subscriber_slots": 4,
            "lanes": 2,
        }
        assert (await c.post("/refits", json=spec)).status_code == 201

        page = await browser.new_page(viewport={"width": 1400, "height": 1000})
        await page.goto(srv.url + "/ui#train")

        async def refit_row() -> list[str]:
            return await page.locator("#r-refits tbody tr").first.locator("td").all_text_contents()

        async def transfer_row() -> list[str]:
            return (
                await page.locator("#r-transfers tbody tr").first.locator("td").all_text_contents()
            )

        cell = "document.querySelector('#r-refits tbody tr td:nth-child(4)')"
        await _until(page, f"{cell} && {cell}.textContent === 'waiting'")
        shown = await refit_row()
        assert shown[:3] == ["rl", "train → gen", "1"]
        assert shown[4].startswith("0 of 6 joined; missing publisher slot 0")
        assert shown[6] == "the refit was created"

        for group, n in (("train", 2), ("gen", 4)):
            for rank in range(n):
                await send(
                    group, rank, "refit_join", refit="rl", epoch=1, slot=rank, digest="1" * 64
                )
        await _until(page, f"{cell}.textContent === 'admitted'")
        shown = await refit_row()
        assert shown[4] == "6 admitted (2 lanes)" and shown[5] == "111111111111…"

        assert (await c.post("/refits/rl/transfers", json={"key": "step-1"})).status_code == 201
        status = "document.querySelector('#r-transfers tbody tr td:nth-child(6)')"
        await _until(page, f"{status} && {status}.textContent === 'running'")
        assert (await transfer_row())[:7] == ["rl", "1", "step-1", "1", "1", "running", "0 of 6"]

        await send("train", 0, "transfer_status", refit="rl", epoch=1, transfer=1, attempt=1,
                   status="done")  # fmt: skip
        await send("gen", 2, "transfer_status", refit="rl", epoch=1, transfer=1, attempt=1,
                   status="failed", detail="nccl timeout")  # fmt: skip
        await _until(page, f"{status}.textContent === 'failed'")
        assert (await transfer_row())[7] == (
            "subscriber slot 2 (gen rank 2) reported failure: nccl timeout"
        )

        assert (await c.post("/refits/rl/transfers", json={"key": "step-1"})).status_code == 201
        await _until(page, f"{status}.textContent === 'running'")
        for group, n in (("train", 2), ("gen", 4)):
            for rank in range(n):
                await send(group, rank, "transfer_status", refit="rl", epoch=1, transfer=1,
                           attempt=2, status="done")  # fmt: skip
        await _until(page, f"{status}.textContent === 'completed'")
        done = await transfer_row()
        assert done[3] == "2" and done[6] == "6 of 6"
        assert done[7] == "every slot reported done (attempt 2, epoch 1)"
        assert await page.locator("#r-refits tbody tr").count() == 1


async def test_an_ended_group_is_shown_as_such_and_the_page_ends_and_deletes(
    console_server: Server, browser
):
    """A group whose run was ended reads "ended" in the list and the panel; the page's own
    buttons end and delete a group (after the operator confirms); the data panel says "No epoch
    plan" only once it has asked."""
    srv = console_server
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        for name in ("old", "live"):
            r = await client.post("/groups", json={"group": name, "world_size": 2, **CALM})
            assert r.status_code == 201, r.text
        r = await client.post("/groups/old/end", json={"reason": "rerun"})
        assert r.status_code == 201, r.text
        served = (await client.get("/ui")).text
        assert 'id="d-none" class="muted hidden"' in served  # not "No epoch plan" before it asked
        page = await browser.new_page(viewport={"width": 1400, "height": 1000})
        page.on("dialog", lambda dialog: asyncio.ensure_future(dialog.accept()))
        await page.goto(srv.url + "/ui#old")
        await _until(page, "document.getElementById('g-run').textContent === 'ended (rerun)'")
        buttons = await page.eval_on_selector_all(
            "#groups button", "bs => bs.map(b => b.textContent)"
        )
        assert any(b.startswith("old ·") and b.endswith("· ended") for b in buttons), buttons
        assert await page.is_disabled("#g-end")
        # asked (its own request, answered after the group's): the group has no plan
        await _until(page, "!document.getElementById('d-none').classList.contains('hidden')")
        assert await page.is_visible("#d-none")
        await page.click("#groups button:has-text('live')")
        await _until(page, "document.getElementById('g-run').textContent === 'forming'")
        await page.click("#g-end")
        await _until(page, "document.getElementById('g-run').textContent.startsWith('ended')")
        assert (await client.get("/groups/live")).json()["ended"][
            "reason"
        ] == "ended by the operator"
        await page.click("#g-delete")
        await _until(page, "document.getElementById('g-action').textContent === 'deleted'")
        listed = (await client.get("/groups")).json()["groups"]
        assert [g["group"] for g in listed] == ["old"]


async def test_a_facet_s_panel_is_drawn_by_the_page_and_follows_its_state_live(
    tmp_path: Path, browser
):
    """The toy facet (tests/facets/toy/, plugged in by ``FOLDPLANE_FACETS``) brings its panel
    in its folder: the page draws it beside the built-in facets' panels, and a bump of its
    counter shows without a reload (the stream says a record came; the panel reads its route)."""
    from tests.facets.test_toy_facet import TOY

    srv = make_server(tmp_path, env=TOY).start()
    try:
        async with httpx.AsyncClient(base_url=srv.url, timeout=10) as c:
            r = await c.post("/groups", json={"group": "g", "world_size": 2})
            assert r.status_code == 201, r.text
            assert (await c.post("/groups/g/toy", json={"by": 5})).status_code == 201
            page = await browser.new_page()
            await page.goto(srv.url + "/ui#g")
            await _until(page, "document.getElementById('toy-count').textContent === '5'")
            assert await page.text_content("#toy-group") == "in group g"
            await page.evaluate("window.__same_page = 'not reloaded'")
            assert (await c.post("/groups/g/toy", json={"by": 995})).status_code == 201
            await _until(page, "document.getElementById('toy-count').textContent === '1,000'")
            assert await page.evaluate("window.__same_page") == "not reloaded"
            # the built-in panels are drawn as before: no epoch plan, no refit
            assert await page.is_visible("#d-none") and await page.is_visible("#r-none")
    finally:
        srv.stop()
