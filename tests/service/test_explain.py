"""``python -m coordinator explain`` and ``GET /groups/{group}/ranks/{rank}/story`` tell the same
story from the same log, and ``replay --plot`` draws the view history to a real image file.

The log is a demo's: a real server, a group of simulated agents, a rank killed (a death report),
replaced by a new process and activated again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from PIL import Image

from foldplane.agent.simhost import SimulatedCluster
from foldplane.api.models import StoryBody
from tests.conftest import free_port
from tests.service.conftest import FAST, ROOT, Server, make_server, replay

CALM = {**FAST, "heartbeat_timeout_s": 600.0}


def explain(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "explain", str(db), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(scope="module")
def demo_log(tmp_path_factory) -> Iterator[tuple[Server, int]]:
    """A server whose group ``demo`` formed, lost rank 1 and took a replacement back in; and the
    log's head once that story was over."""
    srv = make_server(tmp_path_factory.mktemp("demo")).start()
    try:
        head = asyncio.run(_demo(srv))
        yield srv, head
    finally:
        srv.stop()


async def _demo(srv: Server) -> int:
    async with httpx.AsyncClient(base_url=srv.url, timeout=30) as client:
        r = await client.post("/groups", json={"group": "demo", "world_size": 3, **CALM})
        assert r.status_code == 201, r.text
        sim = SimulatedCluster(("127.0.0.1", srv.port), "demo", 3, ranks_per_host=3)
        await sim.start()
        try:
            await sim.wait_until(lambda: sim.all_on(1), timeout=20)
            sim.kill(1)  # the process dies; its launcher reports it
            died = await client.post(
                "/agents/deaths", json={"group": "demo", "rank": 1, "reporter": "launcher"}
            )
            assert died.status_code == 200, died.text
            await sim.wait_until(lambda: sim.all_on(2), timeout=20)
            sim.replace(1)  # the replacement process: a new incarnation joins
            r = await client.post(
                "/proposals",
                params={"wait": 15},
                json={"group": "demo", "op": "activate", "ranks": [1], "proposer": "scheduler"},
            )
            assert r.json()["status"] == "applied", r.text
        finally:
            await sim.stop()
        return (await client.get("/healthz")).json()["head"]


def test_explain_prints_the_story_the_endpoint_serves(demo_log):
    srv, head = demo_log
    served = httpx.get(srv.url + "/groups/demo/ranks/1/story", params={"until": head}, timeout=30)
    assert served.status_code == 200, served.text
    story = served.json()
    assert story["until"] == head
    msgspec.convert(story, StoryBody)  # the shape the OpenAPI document states

    done = explain(srv.db, "--group", "demo", "--rank", "1", "--until", str(head), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == story

    # what the story says: the death report, the view that removed it, the new incarnation
    # and the proposal and view that brought it back
    entries = story["entries"]
    death = next(e for e in entries if e["record"] == "death_reported")
    assert death["reason"] == "death reported by launcher" and death["state"] == "OFFLINE"
    views = [
        (e["version"], e["active"], e["cause"]) for e in entries if e["event"] == "view_committed"
    ]
    assert views == [(1, True, "formation"), (2, False, "auto_deactivation"), (3, True, "proposal")]
    assert any(e["reason"].endswith("(rank_epoch 2)") for e in entries if e["record"] == "join")
    resolved = next(e for e in entries if e["event"] == "proposal_resolved")
    assert resolved["status"] == "applied" and "by scheduler" in resolved["reason"]
    assert story["active"] and story["state"] == "HEALTHY" and story["rank_epoch"] == 2

    text = explain(srv.db, "--group", "demo", "--rank", "1", "--until", str(head))
    assert text.returncode == 0, text.stderr
    lines = text.stdout.splitlines()
    assert lines[0] == story["summary"]
    for e in entries:
        assert any(line.startswith(str(e["offset"])) and e["reason"] in line for line in lines), e

    # an earlier offset tells the story as it stood then, on both sides
    removed = next(e for e in entries if e["event"] == "view_committed" and e["version"] == 2)
    then = httpx.get(
        srv.url + "/groups/demo/ranks/1/story", params={"until": removed["offset"]}
    ).json()
    assert then["active"] is False and then["version"] == 2
    cut = explain(
        srv.db, "--group", "demo", "--rank", "1", "--until", str(removed["offset"]), "--json"
    )
    assert json.loads(cut.stdout) == then


def test_a_story_names_what_is_wrong_with_the_question(demo_log):
    srv, _ = demo_log
    unknown = httpx.get(srv.url + "/groups/nope/ranks/0/story")
    assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_group"
    outside = httpx.get(srv.url + "/groups/demo/ranks/7/story")
    # the status every surface gives the code (wire.codes): the updates poll's too
    assert outside.status_code == 404 and outside.json()["error"] == "rank_out_of_range"
    assert "0..2" in outside.json()["detail"]
    bad = httpx.get(srv.url + "/groups/demo/ranks/x/story")
    assert bad.status_code == 422 and bad.json()["error"] == "invalid_request"
    before = httpx.get(srv.url + "/groups/demo/ranks/0/story", params={"until": 0})
    assert before.status_code == 422

    cli = explain(srv.db, "--group", "nope", "--rank", "0")
    assert cli.returncode == 2 and "no group 'nope'" in cli.stderr
    cli = explain(srv.db, "--group", "demo", "--rank", "9")
    assert cli.returncode == 2 and "rank 9 is not in 0..2" in cli.stderr


@pytest.mark.parametrize("name", ["timeline.png", "timeline.svg"])
def test_replay_plots_the_view_history(demo_log, tmp_path, name):
    srv, _ = demo_log
    out = tmp_path / name
    done = replay(srv.db, "--group", "demo", "--plot", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: replay matches" in done.stdout and f"wrote {out}" in done.stdout
    data = out.read_bytes()
    if name.endswith(".png"):
        assert data[:8] == b"\x89PNG\r\n\x1a\n"
        with Image.open(out) as img:
            img.verify()
        with Image.open(out) as img:
            assert img.format == "PNG" and img.size == (1000, 450)
            # not a blank canvas: the drawing has many colours
            assert len(img.convert("RGB").getcolors(maxcolors=1 << 16) or []) > 10
    else:
        text = data.decode()
        assert text.lstrip().startswith("<?xml") and "<svg" in text
        assert "v2 -[1]" in text and "v3 +[1]" in text  # versions labelled with what changed


def test_replay_plot_refuses_an_unknown_format(demo_log, tmp_path):
    srv, _ = demo_log
    done = replay(srv.db, "--plot", str(tmp_path / "timeline.jpg"))
    assert done.returncode == 2
    assert "must end in .png or .svg" in done.stderr
    assert not (tmp_path / "timeline.jpg").exists()


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_explain_on_the_real_demo_log_names_the_hints_and_the_death(tmp_path):
    """The log of ``python -m coordinator demo`` (real gloo workers, a SIGKILL, real failure
    hints): ``explain`` and the endpoint, served from that log, tell the victim's story alike."""
    db = tmp_path / "demo.db"
    demo = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "demo", "--db", str(db)],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert demo.returncode == 0, demo.stdout + demo.stderr
    srv = Server(db=db, port=free_port(), log_path=tmp_path / "server.log")
    srv.args = ["--store-port", "-1"]
    srv.start()
    try:
        head = httpx.get(srv.url + "/healthz").json()["head"]
        story = httpx.get(
            srv.url + "/groups/demo/ranks/2/story", params={"until": head}, timeout=120
        ).json()
    finally:
        srv.stop()
    done = explain(db, "--group", "demo", "--rank", "2", "--until", str(head), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == story
    entries = story["entries"]
    death = next(e for e in entries if e["record"] == "death_reported")
    assert death["reason"].startswith("death reported")
    removed = next(e for e in entries if e["event"] == "view_committed" and not e["active"])
    assert removed["version"] == 2 and removed["cause"] == "auto_deactivation"
    # the survivors' failed collectives named rank 2 in their hints
    hints = [e for e in entries if e["event"] == "down_report"]
    assert hints and all("failed_ranks_hint" in e["reason"] for e in hints), entries
    assert story["rank_epoch"] == 2 and story["active"]  # the replacement was activated


@pytest.fixture(scope="module")
def epoch_log(tmp_path_factory) -> Iterator[tuple[Server, int]]:
    """A server whose group ``data`` read an epoch with real agents (tests/service/
    epoch_scenario.py): rank 1 left by proposal and came back; and the log's head after it."""
    from tests.service.epoch_scenario import EpochScenario

    srv = make_server(tmp_path_factory.mktemp("epoch"), store=True).start()
    try:
        scenario = EpochScenario(srv.url).start()
        try:
            scenario.leave_and_return()
            scenario.finish()
        finally:
            scenario.close()
        yield srv, httpx.get(srv.url + "/healthz").json()["head"]
    finally:
        srv.stop()


def test_explain_says_which_range_a_rank_held_and_who_took_it_over(epoch_log):
    from tests.service.epoch_scenario import FIRST, SIZE

    srv, head = epoch_log
    served = httpx.get(srv.url + "/groups/data/ranks/1/story", params={"until": head}, timeout=60)
    assert served.status_code == 200, served.text
    story = served.json()
    msgspec.convert(story, StoryBody)
    done = explain(srv.db, "--group", "data", "--rank", "1", "--until", str(head), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == story

    data = [e for e in story["entries"] if e["record"] in ("epoch_plan", "ack", "progress")]
    data = [e for e in data if e["event"].startswith(("epoch_", "assignment_"))]
    assert [e["event"] for e in data] == [
        "epoch_planned",
        "assignment_changed",
        "assignment_changed",
        "epoch_completed",
    ]
    planned, left, back, end = data
    quarter = SIZE // 4
    assert planned["held"] == [[quarter, quarter]]
    assert planned["reason"].endswith(f"it holds {quarter:,}..{2 * quarter - 1:,}")
    # it left version 2 having reported what it read; the others took the rest, in rank order
    kept = FIRST[1]
    assert left["version"] == 2 and left["processed"] == kept and left["remaining"] == []
    assert left["reason"].startswith(
        f"epoch 0: rank 1 held {quarter:,}..{2 * quarter - 1:,}; it had processed {kept:,} "
        f"when it left view 2; ranks 0, 2, 3 took its remaining {quarter - kept:,} (0: "
    )
    assert {m[1] for m in left["moves"]} == {0, 2, 3}
    assert sum(m[3] for m in left["moves"]) == quarter - kept
    assert all(quarter + kept <= m[2] < 2 * quarter for m in left["moves"])
    # back in version 3, it got a share of the others' tails, not its old range again
    assert back["version"] == 3 and back["reason"].startswith("epoch 0: it joined view 3 and got ")
    assert {m[0] for m in back["moves"]} <= {0, 2, 3} and all(m[1] == 1 for m in back["moves"])
    assert end["reason"].startswith("epoch 0 complete: every position processed once; it ")
    assert story["summary"].endswith(
        f"epoch 0 (complete): processed {end['processed']:,}, 0 remaining"
    )

    # a survivor's story: what it took over from rank 1, and what it gave back
    survivor = json.loads(
        explain(srv.db, "--group", "data", "--rank", "0", "--until", str(head), "--json").stdout
    )
    moved = [e for e in survivor["entries"] if e["event"] == "assignment_changed"]
    assert moved[0]["reason"].startswith("epoch 0: with view 2 it got ")
    assert "positions from rank 1 (in " in moved[0]["reason"]
    assert moved[1]["reason"].startswith("epoch 0: rank 0 gave ")
    text = explain(srv.db, "--group", "data", "--rank", "1", "--until", str(head))
    assert text.returncode == 0 and "assignment_changed e0" in text.stdout
    assert left["reason"] in text.stdout


def test_replay_plots_each_rank_s_part_of_the_epoch(epoch_log, tmp_path):
    srv, _ = epoch_log
    out = tmp_path / "data.png"
    done = replay(srv.db, "--group", "data", "--plot", str(out))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: replay matches" in done.stdout and f"wrote {out}" in done.stdout
    with Image.open(out) as img:
        img.verify()
    with Image.open(out) as img:
        # the view history, and below it the data panel: taller than the views alone
        assert img.format == "PNG" and img.size[0] == 1000 and img.size[1] > 450
        colours = dict((c, n) for n, c in img.convert("RGB").getcolors(maxcolors=1 << 16) or [])
    # the held and processed fills and the moves' arrows are drawn, not just the axes
    from foldplane.facets.epochs.plot import HELD_COLOUR, MOVE_COLOUR, PROCESSED_COLOUR

    for name, hex_colour in (
        ("held", HELD_COLOUR),
        ("processed", PROCESSED_COLOUR),
        ("moves", MOVE_COLOUR),
    ):
        rgb = tuple(int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
        assert colours.get(rgb, 0) > 50, f"no {name} drawn"

    svg = tmp_path / "data.svg"
    done = replay(srv.db, "--group", "data", "--plot", str(svg))
    assert done.returncode == 0, done.stdout + done.stderr
    text = svg.read_text()
    assert "data plan of group data" in text and "epoch 0 planned" in text
    assert "epoch 0 completed" in text and "rank 3" in text
