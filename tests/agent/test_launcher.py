"""The launcher against a real coordinator: death reports, clean exits, replacements, the CLI.

The children are light (``join_and_exit.py``: join over the wire protocol, exit with a code),
because what is tested here is the launcher, not the data plane.
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
from pathlib import Path

import pytest

from foldplane.agent.launch import Launcher, Worker, WorkerExit, build_parser, main
from tests.agent.conftest import ROOT, Coordinator

pytestmark = pytest.mark.timeout(120)

CHILD = Path(__file__).with_name("join_and_exit.py")


@pytest.fixture
def coordinator(module_coordinator: Coordinator) -> Coordinator:
    return module_coordinator  # every test uses a group of its own


def launcher(coordinator: Coordinator, group: str, args: list[str], **kw) -> Launcher:
    return Launcher(
        [sys.executable, str(CHILD), *args],
        coordinator=coordinator.url,
        group=group,
        ranks=kw.pop("ranks", [0]),
        stdout=subprocess.PIPE,
        **kw,
    )


def deaths(coordinator: Coordinator, group: str) -> list[dict]:
    body = coordinator.client.request(
        "GET", "/events", params={"group": group, "kind": "death_reported"}
    )
    return [e["payload"] | {"rank": e["rank"]} for e in body["events"]]


def joined(launch: Launcher, rank: int) -> dict:
    out = launch.worker(rank).process.stdout
    assert out is not None
    return json.loads(out.readline())


def test_a_failed_child_is_reported_at_once_with_its_incarnation(coordinator: Coordinator):
    coordinator.create_group("fail", 2, heartbeat_timeout_s=600.0)
    exits: queue.Queue[WorkerExit] = queue.Queue()
    launch = launcher(coordinator, "fail", ["3"], ranks=[0, 1], on_exit=exits.put)
    launch.start()
    got = {exits.get(timeout=60).rank: None for _ in range(2)}
    assert set(got) == {0, 1}
    assert launch.wait(timeout=10) == 1
    by_rank = {e.rank: e for e in launch.exits}
    for rank in (0, 1):
        e = by_rank[rank]
        assert (e.returncode, e.reported, e.failed) == (3, True, True), e
        assert (
            e.describe().startswith(f"rank {rank} (pid ") and "exited with code 3" in e.describe()
        )
    reports = sorted(deaths(coordinator, "fail"), key=lambda d: d["rank"])
    assert [(d["rank"], d["incarnation"]) for d in reports] == [
        (0, by_rank[0].incarnation),
        (1, by_rank[1].incarnation),
    ]
    # Reported, not timed out: the heartbeat timeout is ten minutes.
    assert [coordinator.rank("fail", r)["state"] for r in (0, 1)] == ["OFFLINE", "OFFLINE"]


def test_twin_a_clean_exit_is_not_reported(coordinator: Coordinator):
    coordinator.create_group("clean", 1)
    launch = launcher(coordinator, "clean", ["0"])
    launch.start()
    assert launch.wait(timeout=60) == 0
    assert [(e.returncode, e.reported) for e in launch.exits] == [(0, False)]
    assert deaths(coordinator, "clean") == []
    assert coordinator.rank("clean", 0)["exited"] is True


def test_an_abort_after_a_clean_exit_is_neither_reported_nor_replaced(coordinator: Coordinator):
    coordinator.create_group("teardown", 2, heartbeat_timeout_s=600.0)
    launch = launcher(coordinator, "teardown", ["abort"], ranks=[1], replace_failed=True)
    launch.start()
    assert launch.wait(timeout=60) == 0
    [e] = launch.exits
    assert (e.returncode, e.reported, e.left_cleanly, e.failed) == (-6, False, True, False)
    assert "killed by SIGABRT after it left the group cleanly" in e.describe()
    assert deaths(coordinator, "teardown") == []
    assert coordinator.rank("teardown", 1)["exited"] is True


def test_twin_an_abort_before_the_exit_is_a_death(coordinator: Coordinator):
    coordinator.create_group("aborted", 1, heartbeat_timeout_s=600.0)
    launch = launcher(coordinator, "aborted", ["abort-early"])
    launch.start()
    assert launch.wait(timeout=60) == 1
    [e] = launch.exits
    assert (e.returncode, e.reported, e.left_cleanly, e.failed) == (-6, True, False, True)
    assert [d["incarnation"] for d in deaths(coordinator, "aborted")] == [e.incarnation]
    assert coordinator.rank("aborted", 0)["exited"] is False


def test_a_signal_death_is_reported_and_replaced_up_to_the_budget(coordinator: Coordinator):
    coordinator.create_group("replace", 1, heartbeat_timeout_s=600.0)
    exits: queue.Queue[WorkerExit] = queue.Queue()
    spawned: queue.Queue[Worker] = queue.Queue()
    launch = launcher(
        coordinator, "replace", ["0", "wait"], replace_failed=True, max_replacements=1,
        on_exit=exits.put, on_spawn=spawned.put, stdin=subprocess.PIPE,
    )  # fmt: skip
    launch.start()
    first = spawned.get(timeout=10)
    assert "offset" in joined(launch, 0)["results"][0]
    launch.kill(0)
    death = exits.get(timeout=30)
    assert (death.incarnation, death.returncode, death.reported) == (first.incarnation, -9, True)
    assert "killed by SIGKILL" in death.describe()

    # The replacement is a new incarnation of the same rank, started by the launcher itself.
    second = spawned.get(timeout=30)
    answer = joined(launch, 0)
    assert second.incarnation != first.incarnation
    assert "offset" in answer["results"][0], answer
    assert coordinator.rank("replace", 0)["incarnation"] == second.incarnation

    launch.kill(0)  # the budget is spent: no third process
    assert exits.get(timeout=30).incarnation == second.incarnation
    assert launch.wait(timeout=30) == 1
    assert launch.worker(0) is second
    assert [d["incarnation"] for d in deaths(coordinator, "replace")] == [
        first.incarnation,
        second.incarnation,
    ]


def test_a_late_report_for_a_stale_incarnation_is_refused(coordinator: Coordinator):
    coordinator.create_group("stale", 1, heartbeat_timeout_s=600.0)
    launch = launcher(coordinator, "stale", ["5", "wait"], stdin=subprocess.PIPE)
    launch.start()
    joined(launch, 0)
    # Another process takes the rank (the first is only SYNCED, so the join is accepted) ...
    taken = coordinator.client.post_events(
        [{"type": "join", "group": "stale", "rank": 0, "incarnation": "newer"}]
    )
    assert "offset" in taken[0], taken
    # ... then the first one dies: its report names a stale incarnation and must not land.
    stdin = launch.worker(0).process.stdin
    assert stdin is not None
    stdin.write(b"go\n")
    stdin.flush()
    assert launch.wait(timeout=30) == 1
    (exit_,) = launch.exits
    assert exit_.reported is False
    assert "stale_incarnation" in (exit_.report_error or ""), exit_
    assert coordinator.rank("stale", 0)["incarnation"] == "newer"
    assert deaths(coordinator, "stale") == []


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_workers_get_the_launchers_relay_unless_it_is_turned_off(coordinator: Coordinator):
    coordinator.create_group("relayed", 1, heartbeat_timeout_s=600.0)
    for relay in (True, False):
        launch = launcher(coordinator, "relayed", ["0", "wait"], stdin=subprocess.PIPE, relay=relay)
        launch.start()
        joined(launch, 0)
        env = environ(launch.worker(0).process.pid)
        if relay:
            assert launch.relay is not None and env["FOLDPLANE_RELAY"] == launch.relay.url
            assert env["FOLDPLANE_RELAY"].startswith("http://127.0.0.1:")
        else:
            assert launch.relay is None and "FOLDPLANE_RELAY" not in env
        stdin = launch.worker(0).process.stdin
        assert stdin is not None
        stdin.write(b"go\n")
        stdin.flush()
        assert launch.wait(timeout=30) == 0
        launch.stop()
    assert build_parser().parse_args(["--no-relay", "--nproc", "1", "x.py"]).no_relay is True
    assert build_parser().parse_args(["--nproc", "1", "x.py"]).no_relay is False


def test_workers_get_torchruns_variables_and_a_replacement_keeps_its_local_rank(
    coordinator: Coordinator,
):
    coordinator.create_group("torchrun", 8, heartbeat_timeout_s=600.0)
    launch = launcher(
        coordinator, "torchrun", ["0", "wait"], ranks=[4, 5, 7], stdin=subprocess.PIPE,
        relay=False, world_size=8,
    )  # fmt: skip
    launch.start()
    seen = {r: joined(launch, r)["torchrun"] for r in (4, 5, 7)}
    assert seen == {
        r: {"RANK": str(r), "WORLD_SIZE": "8", "LOCAL_RANK": str(i), "LOCAL_WORLD_SIZE": "3"}
        for i, r in enumerate((4, 5, 7))
    }
    first = launch.worker(5)
    first.process.kill()  # a death: the replacement takes the same local rank (the same GPU)
    first.process.wait(timeout=30)
    launch.replace(5)
    again = joined(launch, 5)
    assert again["torchrun"] == seen[5]
    assert launch.worker(5).incarnation != first.incarnation
    # torchrun's restart count: the rank's second process is its first replacement
    assert again["elastic"]["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert again["elastic"]["TORCHELASTIC_RUN_ID"] == "torchrun"
    for r in (4, 5, 7):
        stdin = launch.worker(r).process.stdin
        assert stdin is not None
        stdin.write(b"go\n")
        stdin.flush()
    launch.wait(timeout=30)
    launch.stop()


def test_the_command_line_sets_world_size_from_the_group_it_joins(coordinator: Coordinator):
    coordinator.create_group("joined", 3, heartbeat_timeout_s=600.0)
    cmd = [
        sys.executable, "-m", "foldplane.agent.launch", "--coordinator", coordinator.url, "--group",
        "joined", "--no-relay", "--ranks", "1,2", str(CHILD), "0",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=90)
    assert done.returncode == 0, done.stderr.decode()
    # each worker's lines come prefixed with its rank
    lines = [
        json.loads(x.partition("]: ")[2])
        for x in done.stdout.decode().splitlines()
        if x.startswith("[rank ")
    ]
    assert sorted((x["torchrun"]["RANK"], x["torchrun"]["WORLD_SIZE"]) for x in lines) == [
        ("1", "3"),
        ("2", "3"),
    ]


def test_the_command_line_creates_the_group_and_runs_the_workers(coordinator: Coordinator):
    cmd = [
        sys.executable, "-m", "foldplane.agent.launch", "--coordinator", coordinator.url, "--group", "cli",
        "--world-size", "2", "--nproc", "2", str(CHILD), "0",
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, timeout=90)
    assert done.returncode == 0, done.stderr.decode()
    assert [coordinator.rank("cli", r)["exited"] for r in (0, 1)] == [True, True]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--group", "g", "--nproc", "2", "x.py"], "--coordinator (or FOLDPLANE_COORDINATOR)"),
        (["--coordinator", "http://h:1", "--nproc", "2", "x.py"], "--group (or FOLDPLANE_GROUP)"),
        (["--coordinator", "http://h:1", "--group", "g", "x.py"], "give --nproc N or --ranks"),
        (
            ["--coordinator", "http://h:1", "--group", "g", "--ranks", "a-b", "x.py"],
            "--ranks 'a-b'",
        ),
    ],
)
def test_command_line_errors_name_the_missing_piece(monkeypatch, capsys, argv, message):
    monkeypatch.delenv("FOLDPLANE_COORDINATOR", raising=False)
    monkeypatch.delenv("FOLDPLANE_GROUP", raising=False)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_an_unreachable_coordinator_fails_the_command_line_before_starting_workers(capsys):
    from tests.conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    argv = ["--coordinator", url, "--group", "g", "--world-size", "2", "--nproc", "2",
            "--start-timeout", "1", str(CHILD), "0"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"launch: no foldplane coordinator at {url}" in err and "after 1 s" in err, err
