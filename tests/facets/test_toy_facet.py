"""A facet is one folder plugged in by one line: the toy facet (``tests/facets/toy/``), plugged
in by ``FOLDPLANE_FACETS`` alone, runs end to end through a real coordinator process: its record
is appended, the fold refuses a bad one with a code, its projection row is written and a replay
of the log derives it again, its route answers, an agent's long poll receives its update, the
console page holds its panel and ``serve`` takes its option, checks it, starts what it asks for
and closes it at shutdown."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from foldplane.agent.relay import Relay
from foldplane.eventlog import open_log
from tests.agent.test_relay import Rank, own_state
from tests.service.conftest import ROOT, make_server

#: The one line that plugs the toy facet in (coordinator/fold/registry.py).
TOY = {"FOLDPLANE_FACETS": "tests.facets.toy"}

#: A worker that follows the toy facet's updates and sends its event: it asks its agent for
#: them (``Agent.on_update``, which then reads their Struct), adds to the counter
#: through its agent (``Agent.send_event``: one accepted, one the fold refuses, one that does
#: not fit the event's Struct) and prints what it saw.
AGENT = """
import json, sys, threading
from foldplane.agent import Agent, EventRefused
from tests.facets.toy.protocol import CounterUpdate
from tests.facets.toy.protocol import AddEvent

got, seen = [], {7: threading.Event(), 9: threading.Event()}

def follow(update):
    got.append([update.group, update.count])
    if update.count in seen:
        seen[update.count].set()

agent = Agent(sys.argv[1], group="g", rank=0, backend="gloo")
agent.on_update(CounterUpdate, follow)
agent.start()
out = {"seven": seen[7].wait(30)}
out["offset"] = agent.send_event(AddEvent, by=2)
out["nine"] = seen[9].wait(30)
try:
    agent.send_event(AddEvent, by=0)
except EventRefused as exc:
    out["refused"] = [exc.code, exc.detail]
try:
    agent.send_event(AddEvent, by="two")
except ValueError as exc:
    out["unfit"] = str(exc)
out["alive"] = agent.stopped is None
agent.close()
out["got"] = got
print(json.dumps(out))
"""


#: A worker whose environment holds the line that plugs the toy facet in: its agent loads the
#: facet's worker part (``tests/facets/toy/worker.py``, named by its ``protocol.py``) and answers
#: what the part offers as its own; the part alone sends the facet's event.
WORKER_PART = """
import json, sys
from foldplane.agent import Agent
from tests.facets.toy.protocol import AddEvent

agent = Agent(sys.argv[1], group="g", rank=0, backend="gloo").start()
out = {"three": agent.counter.wait_for(3, 30)}
out["offset"] = agent.add_to_counter(2)
out["five"] = agent.counter.wait_for(5, 30)
try:
    agent.send_event(AddEvent, by=1)
except ValueError as exc:
    out["owned"] = str(exc)
agent.close()
print(json.dumps(out))
"""


def replay(db: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "replay", str(db)],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def stored_row(db: Path) -> dict | None:
    log = await open_log(db, read_only=True)
    try:
        row = await log.get_projection("toy_counter", "g", 0)
        return None if row is None else row.doc
    finally:
        await log.close()


def test_the_toy_facet_plugs_in_with_its_folder_and_one_line(tmp_path: Path) -> None:
    note = tmp_path / "note.txt"
    srv = make_server(tmp_path, env=TOY, args=["--toy-note", str(note)]).start()
    try:
        url = srv.url
        created = httpx.post(url + "/groups", json={"group": "g", "world_size": 2})
        assert created.status_code == 201, created.text

        # the route answers, and each bump is a record the fold applies
        for by, count in ((3, 3), (4, 7)):
            r = httpx.post(url + "/groups/g/toy", json={"by": by})
            assert r.status_code == 201, r.text
            assert r.json() == {"group": "g", "count": count}
        # the fold refuses a bad bump with a code, and nothing is logged
        bad = httpx.post(url + "/groups/g/toy", json={"by": 0})
        assert bad.status_code == 422, bad.text
        assert bad.json()["error"] == "invalid_event" and "by must be" in bad.json()["detail"]
        unknown = httpx.post(url + "/groups/nope/toy", json={"by": 1})
        assert unknown.status_code == 404 and unknown.json()["error"] == "unknown_group"
        assert httpx.get(url + "/groups/g/toy").json() == {"group": "g", "count": 7}

        # the log holds the two bumps (its kinds are the facet's)
        events = httpx.get(url + "/events", params={"kind": "toy_bump"}).json()["events"]
        assert [(e["group"], e["payload"]) for e in events] == [("g", {"by": 3}), ("g", {"by": 4})]

        # an agent of the group receives the facet's updates: a worker process that follows
        # them declares their Struct and runs an agent of rank 0
        worker = subprocess.run(
            [sys.executable, "-c", AGENT, url],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr
        out = json.loads(worker.stdout.splitlines()[-1])
        assert out["seven"] and out["nine"], out
        # its event is a record of the log, of rank 0, that the fold applied
        added = httpx.get(url + "/events", params={"kind": "toy_add"}).json()["events"]
        assert [(e["offset"], e["rank"], e["payload"]["by"]) for e in added] == [
            (out["offset"], 0, 2)
        ]
        # the fold's refusal comes back to the sender with its code, and the agent lives on
        assert out["refused"][0] == "invalid_event" and "by must be" in out["refused"][1]
        assert "not a valid 'toy_add' event" in out["unfit"] and out["alive"]
        assert out["got"] == [["g", 3], ["g", 7], ["g", 9]]
        assert httpx.get(url + "/groups/g/toy").json() == {"group": "g", "count": 9}

        # the OpenAPI document has its route and its bodies
        doc = httpx.get(url + "/openapi.json").json()
        assert "/groups/{group}/toy" in doc["paths"]
        assert {"BumpRequest", "CounterBody"} <= set(doc["components"]["schemas"])

        # the console page holds its panel after the built-in facets' (the browser draws it:
        # tests/service/test_console.py)
        page = httpx.get(url + "/ui").text
        assert page.index('id="data-panel"') < page.index('id="refit-panel"')
        assert page.index('id="refit-panel"') < page.index('id="toy-panel"') < page.index("</main>")
    finally:
        assert srv.stop() == 0, srv.output()
    # its part of serve started beside the server and was closed at shutdown
    assert note.read_text() == "started at offset 0\nclosed\n"

    # a restart restores the facet from the snapshot (its state, its latest update)
    srv.start()
    try:
        assert httpx.get(srv.url + "/groups/g/toy").json() == {"group": "g", "count": 9}
    finally:
        assert srv.stop() == 0, srv.output()
    started, closed = note.read_text().splitlines()[2:]
    assert started.startswith("started at offset ") and int(started.split()[-1]) > 0
    assert closed == "closed"

    # the projection row the host wrote, which a replay of the log derives again, byte for byte
    row = asyncio.run(stored_row(srv.db))
    assert row is not None and row["count"] == 9 and row["by"] == 2
    done = replay(srv.db, TOY)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "OK: replay matches" in done.stdout


def serve(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "serve", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_serve_lists_and_checks_the_toy_facets_option_before_it_opens_the_log(
    tmp_path: Path,
) -> None:
    """``serve --help`` lists the option of the facets' serve parts; a value its check refuses
    stops ``serve`` with status 2, naming it, before any log is made."""
    helped = serve(["--help"], TOY)
    assert helped.returncode == 0 and "--toy-note FILE" in helped.stdout, helped.stderr
    assert "--lighthouse-port N" in helped.stdout
    db = tmp_path / "log.db"
    refused = serve(["--db", str(db), "--toy-note", str(tmp_path)], TOY)
    assert refused.returncode == 2 and "--toy-note" in refused.stderr, refused.stderr
    assert "is a directory" in refused.stderr and not db.exists()
    # twin: without the line, serve knows no such option
    assert "--toy-note" not in serve(["--help"], {}).stdout
    unknown = serve(["--db", str(db), "--toy-note", "x"], {})
    assert unknown.returncode == 2 and "unrecognized arguments: --toy-note" in unknown.stderr
    assert not db.exists()


def test_a_relay_carries_the_updates_of_the_facets_foldplane_facets_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one line that plugs the toy facet in also plugs it into the launcher's relay: the
    relay reads the updates of the facets ``FOLDPLANE_FACETS`` names (their ``protocol``
    modules) beside foldplane's, so a worker behind it gets the toy facet's update from the
    lane's channel as it would from the coordinator (a relay that read only foldplane's
    facets left it out of the lane's cache, and the worker never saw it)."""
    srv = make_server(tmp_path, env=TOY).start()
    monkeypatch.setenv("FOLDPLANE_FACETS", TOY["FOLDPLANE_FACETS"])
    try:
        body = {"group": "g", "world_size": 2, "heartbeat_timeout_s": 600.0}
        assert httpx.post(srv.url + "/groups", json=body).status_code == 201
        with Relay(srv.url) as relay:
            assert "toy_counter" in relay.updates.types
            rank = Rank(relay.url, "g", 0)
            assert rank.send(rank.event("join")).status_code == 200
            rank.wait_for(own_state(0, "SYNCED"))  # its first poll proves its right on its own
            solo = relay.stats["polls_solo"]
            assert httpx.post(srv.url + "/groups/g/toy", json={"by": 3}).status_code == 201
            got = rank.wait_for(lambda u: u["type"] == "toy_counter")
            assert got == {"type": "toy_counter", "offset": got["offset"], "group": "g", "count": 3}
            # it came from the lane's channel, not from a poll forwarded on its own
            assert relay.stats["polls_solo"] == solo and relay.stats["lane_pushes"] > 0
            rank.close()
    finally:
        assert srv.stop() == 0, srv.output()
    # twin: a relay told of no facet of the deployment's reads foldplane's only
    with Relay(srv.url, facets=()) as bare:
        assert "toy_counter" not in bare.updates.types and "data_moves" in bare.updates.types


def test_twin_without_the_line_nothing_of_the_toy_facet_is_served(tmp_path: Path) -> None:
    srv = make_server(tmp_path).start()
    try:
        url = srv.url
        assert httpx.post(url + "/groups", json={"group": "g", "world_size": 2}).status_code == 201
        assert httpx.post(url + "/groups/g/toy", json={"by": 3}).status_code == 404
        assert "/groups/{group}/toy" not in httpx.get(url + "/openapi.json").json()["paths"]
        assert 'id="toy-panel"' not in httpx.get(url + "/ui").text
    finally:
        srv.stop()


def test_a_facet_that_cannot_be_imported_stops_the_command_naming_it(tmp_path: Path) -> None:
    done = replay(tmp_path / "log.db", {"FOLDPLANE_FACETS": "tests.facets.nosuch"})
    assert done.returncode == 2
    assert "FOLDPLANE_FACETS" in done.stderr and "tests.facets.nosuch" in done.stderr


def test_the_line_that_plugs_the_toy_facet_in_gives_a_worker_its_worker_part(
    tmp_path: Path,
) -> None:
    """``FOLDPLANE_FACETS`` in a worker's environment reaches the toy facet's worker part the
    way the facets of foldplane's are reached: its ``protocol.py`` names it, the agent loads
    it, hands it the facet's updates and its event's answers, and offers ``agent.counter`` and
    ``agent.add_to_counter``; twin: without the line the agent has no such names."""
    srv = make_server(tmp_path, env=TOY).start()
    try:
        url = srv.url
        assert httpx.post(url + "/groups", json={"group": "g", "world_size": 2}).status_code == 201
        assert httpx.post(url + "/groups/g/toy", json={"by": 3}).status_code == 201
        worker = subprocess.run(
            [sys.executable, "-c", WORKER_PART, url],
            cwd=ROOT,
            env={**os.environ, **TOY},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert worker.returncode == 0, worker.stdout + worker.stderr
        out = json.loads(worker.stdout.splitlines()[-1])
        assert out["three"] and out["five"], out
        assert (
            out["owned"] == "'toy_add' is the event of the toy facet's worker part, which sends it"
        )
        added = httpx.get(url + "/events", params={"kind": "toy_add"}).json()["events"]
        assert [(e["offset"], e["rank"], e["payload"]["by"]) for e in added] == [
            (out["offset"], 0, 2)
        ]
    finally:
        assert srv.stop() == 0, srv.output()
    bare = subprocess.run(
        [
            sys.executable,
            "-c",
            "from foldplane.agent import Agent; "
            "a = Agent('http://127.0.0.1:9', group='g', rank=0); "
            "print(hasattr(a, 'counter'), hasattr(a, 'refits'))",
        ],
        cwd=ROOT,
        env={k: v for k, v in os.environ.items() if k != "FOLDPLANE_FACETS"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bare.stdout.split() == ["False", "True"], bare.stdout + bare.stderr
