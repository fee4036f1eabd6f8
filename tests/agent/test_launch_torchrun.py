"""The launcher speaks torchrun (agent/launch.py, docs/torchrun.md): torchrun's flag names where
they mean the same, a plain refusal of the others, ``MASTER_ADDR``/``MASTER_PORT`` so an
unchanged ``init_process_group("gloo")`` script runs, each rank's output prefixed or in a file
of its own, and the end-of-run summary (each rank's fate, the replacements used of the budget,
the first error). Each test runs the real command line against a real coordinator."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from foldplane.agent.launch import main
from tests.agent.conftest import ROOT, Coordinator

pytestmark = pytest.mark.timeout(180)

CHILD = Path(__file__).with_name("join_and_exit.py")
PLAIN = Path(__file__).with_name("plain_gloo.py")


@pytest.fixture
def coordinator(module_coordinator: Coordinator) -> Coordinator:
    return module_coordinator  # every test uses a group of its own


def launch(*args: str, timeout: float = 150) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "foldplane.agent.launch", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def lines(text: str) -> list[dict]:
    """The workers' JSON lines, prefixed ``[rank R]: `` on the launcher's stdout."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"\[rank (\d+)\]: (\{.*\})", line)
        if m:
            out.append({**json.loads(m.group(2)), "prefix": int(m.group(1))})
    return out


def test_torchruns_flag_names_run_the_group_and_each_rank_prints_prefixed(
    coordinator: Coordinator,
):
    host_port = coordinator.url.removeprefix("http://")
    done = launch(
        "--rdzv-endpoint", host_port, "--rdzv-id", "tr-flags", "--nnodes", "1",
        "--nproc-per-node", "2", "--max-restarts", "0", "--no-relay", str(CHILD), "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    got = lines(done.stdout)
    assert sorted(x["prefix"] for x in got) == [0, 1]
    assert all(x["torchrun"]["RANK"] == str(x["prefix"]) for x in got)
    assert all(x["torchrun"]["WORLD_SIZE"] == "2" for x in got)  # --nnodes x --nproc-per-node
    assert coordinator.status("tr-flags")["config"]["world_size"] == 2
    assert {x["elastic"]["TORCHELASTIC_MAX_RESTARTS"] for x in got} == {"0"}
    assert "every rank's last process exited cleanly (2 ranks)" in done.stderr
    assert "replacements used: 0 of 0" in done.stderr


def test_node_rank_runs_that_nodes_ranks() -> None:
    from foldplane.agent.launch import build_parser

    a = build_parser().parse_args(
        ["--nnodes", "2", "--node_rank", "1", "--nproc_per_node", "3", "x.py"]
    )
    assert (a.nnodes, a.node_rank, a.nproc) == ("2", 1, 3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--standalone", "--nproc-per-node", "2", "x.py"],
            "torchrun's --standalone is not supported",
        ),
        (
            ["--rdzv-conf", "a=b", "--nproc-per-node", "2", "x.py"],
            "torchrun --rdzv-backend foldplane --rdzv-conf",
        ),
        (["--tee", "3", "--nproc-per-node", "2", "x.py"], "use --log-dir"),
        (["--rdzv-backend", "c10d", "--nproc-per-node", "2", "x.py"], "--rdzv-backend c10d"),
        (
            ["--nnodes", "1:4", "--nproc-per-node", "2", "x.py"],
            "a range (MIN:MAX) is torchrun's elastic",
        ),
        (["--nnodes", "2", "x.py"], "--nnodes needs --nproc-per-node"),
        (
            ["--nnodes", "2", "--node-rank", "2", "--nproc-per-node", "1", "x.py"],
            "--node-rank 2 is not in 0..1",
        ),
        (["--nproc-per-node", "gpu", "x.py"], "torchrun's auto, cpu and gpu are not taken"),
        (["--max-restarts", "-1", "--nproc-per-node", "1", "x.py"], "--max-restarts '-1'"),
    ],
)
def test_what_it_does_not_take_is_refused_saying_what_to_do(monkeypatch, capsys, argv, message):
    monkeypatch.setenv("FOLDPLANE_COORDINATOR", "http://127.0.0.1:1")
    monkeypatch.setenv("FOLDPLANE_GROUP", "g")
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_a_failure_is_replaced_within_the_budget_and_the_summary_names_the_first_error(
    coordinator: Coordinator, tmp_path: Path
):
    logs = tmp_path / "logs"
    done = launch(
        "--coordinator", coordinator.url, "--group", "tr-fail", "--world-size", "2",
        "--nproc-per-node", "2", "--max-restarts", "1", "--log-dir", str(logs), "--no-relay",
        str(CHILD), "3",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    files = sorted(p.name for p in logs.iterdir())
    assert len(files) == 3 and {"rank-0.log", "rank-1.log"} <= set(files)
    [replacement] = [f for f in files if "replacement-1" in f]
    again = json.loads(
        next(x for x in (logs / replacement).read_text().splitlines() if x[:1] == "{")
    )
    assert again["elastic"]["TORCHELASTIC_RESTART_COUNT"] == "1"
    assert again["elastic"]["TORCHELASTIC_MAX_RESTARTS"] == "1"
    summary = done.stderr[done.stderr.index("launch summary") :]
    assert "2 of 2 ranks failed: 0, 1; replacements used: 1 of 1" in summary
    assert re.search(
        r"rank \d: first process \(pid \d+\) exited with code 3; replacement 1", summary
    )
    first = re.search(
        r"first error: rank (\d) \(pid \d+, incarnation \w+\) exited with code 3", summary
    )
    assert first, summary
    assert f"its output: {logs / ('rank-' + first.group(1) + '.log')}" in summary
    assert "failing with code 3 on purpose" in summary  # the last lines it wrote


def test_an_unchanged_gloo_script_runs_on_the_launchers_master_addr_and_port(
    coordinator: Coordinator,
):
    done = launch(
        "--coordinator", coordinator.url, "--group", "tr-plain", "--world-size", "2",
        "--nproc-per-node", "2", "--no-relay", str(PLAIN),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    got = lines(done.stdout)
    assert sorted(x["rank"] for x in got) == [0, 1] and {x["sum"] for x in got} == {3.0}
    assert len({x["master"] for x in got}) == 1 and got[0]["master"].startswith("127.0.0.1:")
    assert 'init_process_group("foldplane") makes it elastic' in done.stderr
