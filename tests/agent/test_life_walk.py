"""One status vocabulary on every surface, through a run's whole life: created, formed, a
death, a replacement, a clean end, deleted. At each stage ``GET /groups/{group}``, its line in
``GET /groups``, the console's picture, the command line's ``group show`` and ``group list``
say the same word (``wire/life.py``) with the same rank counts; and the coordinator's decision
log tells the life one line per decision, in order, with wall-clock times and who reported
the death. A real coordinator and real agents."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from foldplane.agent import Agent
from foldplane.cli import main
from foldplane.wire import life
from tests.agent.conftest import ROOT, Coordinator

pytestmark = pytest.mark.timeout(120)

G = "walk"
#: rank 1's process: joins, says its incarnation once it holds view 1, and waits to be killed
DOOMED = f"""
import sys, threading
from foldplane.agent import Agent
a = Agent(sys.argv[1], group={G!r}, rank=1, heartbeat_interval_s=0.2).start()
a.wait_for_view(1, timeout=60)
print(a.incarnation, flush=True)
threading.Event().wait()
"""


def says(c: Coordinator, capsys, status: str, tally: str) -> None:
    """Every surface says ``status``, and the rank counts read ``tally``."""
    doc = c.client.group(G)
    picture = httpx.get(f"{c.url}/ui/api/groups/{G}").json()
    lines = [line for line in c.client.groups() if line["group"] == G]
    assert doc["status"] == status, doc
    assert picture["status"] == status, picture
    text = life.run_text(doc)
    assert text.startswith(status) and text.endswith(f"2 ranks: {tally}"), text
    assert main(["group", "show", G, "--coordinator", c.url]) == 0
    assert capsys.readouterr().out.strip() == f"group {G!r} {text}"
    assert main(["group", "list", "--coordinator", c.url]) == 0
    listed = capsys.readouterr().out
    if status == life.DELETED:
        assert lines == [] and f"{G}:" not in listed, listed  # gone from the listings
        return
    [line] = lines
    assert line["status"] == status and line["rank_counts"] == doc["rank_counts"], line
    assert f"{G}: {life.run_text(line)}" in listed and life.run_text(line) == text, listed


def test_every_surface_says_the_same_through_a_run_s_life(coordinator: Coordinator, capsys):
    c = coordinator
    c.create_group(G, 2)
    says(c, capsys, life.FORMING, "2 never joined")
    # rank 1 in a process of its own, so that it can die
    doomed = subprocess.Popen(
        [sys.executable, "-c", DOOMED, c.url], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    agents = [Agent(c.url, group=G, rank=0, heartbeat_interval_s=0.2).start()]
    replacement = None
    try:
        agents[0].wait_for_view(1, timeout=60)
        incarnation = doomed.stdout.readline().strip()  # printed once it holds view 1
        says(c, capsys, life.RUNNING, "2 online")

        # a death, reported by a supervisor that names itself
        doomed.kill()
        doomed.wait(30)
        body = {"group": G, "rank": 1, "incarnation": incarnation, "reporter": "supervisor-7"}
        assert httpx.post(f"{c.url}/agents/deaths", json=body).status_code == 200
        agents[0].wait_for_view(2, timeout=60)
        says(c, capsys, life.RUNNING, "1 online, 1 died")

        # a replacement, activated by a proposal
        replacement = Agent(c.url, group=G, rank=1, heartbeat_interval_s=0.2).start()
        replacement.wait_for_state("HEALTHY", timeout=60)
        applied = httpx.post(
            f"{c.url}/proposals?wait=30", json={"group": G, "op": "activate", "ranks": [1]}
        ).json()
        assert applied["status"] == "applied", applied
        agents[0].wait_for_view(3, timeout=60)
        says(c, capsys, life.RUNNING, "2 online")
    finally:
        doomed.kill()
        for a in [*agents, *([replacement] if replacement else [])]:
            a.close()
    # a clean end: every rank exited cleanly, so the run finished (and refuses a stray)
    says(c, capsys, life.FINISHED, "2 exited cleanly")
    with pytest.raises(RuntimeError, match=r"group 'walk' .* finished at offset \d+"):
        Agent(c.url, group=G, rank=0).start()
    assert httpx.delete(f"{c.url}/groups/{G}").status_code == 201
    says(c, capsys, life.DELETED, "2 exited cleanly")

    # the decision log: one line per decision, in the life's order
    wanted = [
        rf"group {G} created: 2 ranks \(run \d+\)",
        rf"group {G} rank [01] joined: joined as incarnation",
        rf"group {G} rank [01] joined: joined as incarnation",
        rf"group {G} view 1 committed at \d\d:\d\d:\d\d\.\d{{3}}Z",
        rf"group {G} rank 1 lost: death reported by supervisor-7",
        rf"group {G} view 2 committed at",
        rf"group {G} rank 1 joined: joined as incarnation \S+ \(rank_epoch 2\)",
        rf"group {G} view 3 committed at",
        rf"group {G} rank [01] left: exited cleanly",
        rf"group {G} rank [01] left: exited cleanly",
        rf"group {G} finished: every rank exited cleanly",
        rf"group {G} deleted \(its run had finished\)",
    ]
    # the server writes the deletion's line as it decides it, after the answer to the DELETE
    assert c.output.wait_for(f"group {G} deleted", 30), c.log_path.read_text()
    lines = [x for x in c.log_path.read_text().splitlines() if f"group {G} " in x]
    i = 0
    for pattern in wanted:
        while i < len(lines) and not re.search(pattern, lines[i]):
            i += 1
        i += 1
    assert i <= len(lines), ("missing or out of order", wanted, lines)
    assert sum(f"group {G} finished" in x for x in lines) == 1, lines  # one ending, one line
    # a view the clean end commits (the first exit's, when it commits before the second exit)
    # says it removed a rank that exited cleanly, never auto_deactivation
    first_exit = next(i for i, x in enumerate(lines) if "left: exited cleanly" in x)
    for x in lines[first_exit:]:
        if "committed at" in x:
            assert re.search(r"\(exit: ranks \[[01]\] exited cleanly\)", x), lines
    assert not any(re.search(r"\b1\d{18}\b", x) for x in lines), lines  # no raw ns
