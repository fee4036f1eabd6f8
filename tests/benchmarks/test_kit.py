"""The benchmark kit: workers' lines, the kill-to-recovery clock and the coordinator service."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from foldplane.benchmarks.kit.kills import time_recovery
from foldplane.benchmarks.kit.service import Service
from foldplane.benchmarks.kit.workers import Lines


def test_lines_reads_every_json_line_of_a_process_and_skips_the_rest() -> None:
    code = (
        "import json\n"
        "print('warming up')\n"
        "for i in range(3): print(json.dumps({'rank': i}), flush=True)\n"
        "print('{not json')\n"
        "print(json.dumps({'done': True}), flush=True)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    lines = Lines()
    lines.follow(child)
    lines.until(lambda line: line.get("done", False), 30, "the child's last line")
    child.wait(30)
    assert lines.seen == [{"rank": 0}, {"rank": 1}, {"rank": 2}, {"done": True}]
    lines.wait_for(lambda: len(lines.seen) == 4, 0.01, "what was already read")  # no wait
    assert lines.garbled == ["{not json"]
    with pytest.raises(TimeoutError, match=r"lines not read as JSON: \['\{not json'\]"):
        lines.wait_for(lambda: False, 0.01, "more")


def test_lines_of_workers_that_share_a_pipe_do_not_run_together() -> None:
    """Four processes print JSON lines into one pipe as the example and the test workers do
    (``print(line + "\\n", end="", flush=True)``, one write each), unbuffered as under
    ``PYTHONUNBUFFERED``, where a plain ``print`` writes the newline in a write of its own:
    every line arrives whole."""
    code = (
        "import json, sys\n"
        "for step in range(300):\n"
        "    line = {'rank': int(sys.argv[1]), 'step': step}\n"
        "    print(json.dumps(line) + '\\n', end='', flush=True)\n"
    )
    read, write = os.pipe()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    children = [
        subprocess.Popen([sys.executable, "-c", code, str(r)], stdout=write, env=env)
        for r in range(4)
    ]
    os.close(write)
    lines = Lines()
    with os.fdopen(read, "rb") as out:
        lines.follow(SimpleNamespace(process=SimpleNamespace(stdout=out)))
        lines.wait_for(lambda: len(lines.seen) == 4 * 300, 60, "every line")
    for child in children:
        assert child.wait(30) == 0
    assert lines.garbled == []
    assert sorted((x["rank"], x["step"]) for x in lines.seen) == [
        (r, s) for r in range(4) for s in range(300)
    ]


def test_a_wait_that_runs_out_names_what_it_waited_for() -> None:
    lines = Lines()
    lines.queue.put({"rank": 0})
    with pytest.raises(
        TimeoutError, match="formation of g1: not within 0 s; last: \\[{'rank': 0}\\]"
    ):
        lines.wait_for(lambda: False, 0.2, "formation of g1")


def test_recovery_runs_from_the_kill_to_the_last_survivors_first_recovered_line() -> None:
    """Lines from before the kill, from the victim and a survivor's later lines do not count."""
    lines = Lines()
    lines.queue.put({"rank": 1, "version": 2, "t": 0.0})  # an old line, stamped long before
    stamped: dict[str, float] = {}

    def kill() -> None:  # the survivors' lines, as the workers would print them
        t = stamped["kill"] = time.time()
        for rank, version, dt in ((0, 2, 0.2), (3, 2, 0.1), (1, 2, 0.5), (0, 3, 0.9)):
            lines.queue.put({"rank": rank, "version": version, "t": t + dt})

    got = time_recovery(
        lines, kill, {0, 1}, lambda line, at: line["rank"] if line["t"] > at else None, 30, "x"
    )
    assert got.killed_at <= stamped["kill"]
    assert {r: line["t"] - stamped["kill"] for r, line in got.first.items()} == pytest.approx(
        {0: 0.2, 1: 0.5}
    )
    assert got.seconds == max(line["t"] for line in got.first.values()) - got.killed_at
    assert lines.queue.qsize() == 1  # it stopped at the last survivor's first line


def test_a_service_answers_stops_and_starts_again_on_its_port() -> None:
    with Service(name="kit-test").start() as service:
        assert service.role() == "leader"
        group = service.new_group("g", 2)
        assert group == "g1"
        config = service.client.group(group)["config"]
        assert (config["world_size"], config["formation_timeout_s"]) == (2, 300.0)
        port = service.port
        service.signal(signal.SIGKILL)
        assert service.health() is None
        service.start()
        assert (service.port, service.role()) == (port, "leader")
        assert service.client.group(group)["config"] == config  # the same log
    assert not service.dir.exists()
