"""The README's quick start, run as written: its shell lines and its worker, in order, in a
fresh folder. Two substitutions only: the port (8470 may be taken on a shared machine) and
``.venv/bin/python`` (this interpreter, whichever virtual environment runs the tests). Then
run again against the same coordinator, as the README says it may not be: the group's
creation and every worker are refused at once with what to do, and the first run's history
(``replay --json``) stays byte-identical."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.agent.conftest import ROOT
from tests.conftest import free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def quick_start() -> tuple[list[str], str]:
    """The quick start's shell blocks and its Python block, in the README's order."""
    text = (ROOT / "README.md").read_text()
    section = re.split(r"\n##+ ", text.split("## Quick start", 1)[1], maxsplit=1)[0]
    blocks = re.findall(r"```(bash|python)\n(.*?)```", section, re.S)
    shells = [body for lang, body in blocks if lang == "bash"]
    [worker] = [body for lang, body in blocks if lang == "python"]
    return shells, worker


def replay_json(folder: Path) -> bytes:
    done = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "replay", "train.db", "--json"],
        cwd=folder, capture_output=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_readme_quick_start_runs_as_written_and_a_second_run_is_refused(tmp_path: Path):
    port = str(free_port())
    shells, worker = quick_start()
    assert len(shells) == 3, shells  # serve and create; start the workers; operate and audit

    def adapt(text: str) -> str:
        return text.replace("8470", port).replace(".venv/bin/python", sys.executable)

    (tmp_path / "worker.py").write_text(adapt(worker))
    serve, create = adapt(shells[0]).split("# 2.", 1)
    create = "# 2." + create
    # the coordinator outlives the first run (as in a person's terminal), its output in a file
    serve = serve.replace(f"--port {port} &", f"--port {port} >server.out 2>&1 &")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOLDPLANE_")}
    # one shell, as a person's terminal: the background jobs of one block live on into the next
    script = tmp_path / "quickstart.sh"
    waits = "\n".join(
        [
            serve + create,
            adapt(shells[1]),
            # the person reads the workers' "view 1" lines before step 4
            # (or one says its all_reduce failed: then the assertions below show it)
            'until [ "$(grep -c "view 1, all_reduce gave 4" workers.out 2>/dev/null)" = 4 ] '
            '|| grep -q "failed ranks" workers.out 2>/dev/null; do sleep 0.5; done',
            adapt(shells[2]),
            # (jobs -p in a command substitution runs in a subshell, which has no jobs)
            "jobs -p >pids",
            "wait $(tail -n 4 pids)",  # the workers exit after view 2
        ]
    )
    script.write_text("set -e\n" + waits.replace(" & done", " >>workers.out 2>&1 & done"))
    shell = subprocess.Popen(
        ["bash", str(script)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    timed_out = None
    second = None
    try:
        out, err = shell.communicate(timeout=360)
        if shell.returncode == 0:
            first = replay_json(tmp_path)
            # the same steps again, against the same coordinator: create, then the workers
            again = tmp_path / "again.sh"
            again.write_text(
                create + adapt(shells[1]).replace(" & done", " >>again.out 2>&1 & done") + "wait\n"
            )
            second = subprocess.run(
                ["bash", str(again)], cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=180,
            )  # fmt: skip
            assert replay_json(tmp_path) == first  # byte for byte: the history is untouched
    except subprocess.TimeoutExpired as exc:
        timed_out = exc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)  # the coordinator, and whatever was left
    workers = (tmp_path / "workers.out").read_text() if (tmp_path / "workers.out").exists() else ""
    assert timed_out is None, (f"the quick start did not end in {timed_out.timeout} s", workers)
    assert shell.returncode == 0, (out, err, workers)
    assert workers.count("view 1, all_reduce gave 4") == 4, workers
    assert workers.count("view 2, active ranks [0, 1, 2]") == 4, workers
    assert '"status":"applied"' in out.replace(" ", ""), out
    assert "OK: replay matches the stored projections" in out, out
    assert re.search(r"train: (running|finished); view 2; 4 ranks: ", out), out
    # the second run: refused at once, saying so and what to do, and nothing summed
    assert second is not None
    assert '"error":"group_ended"' in second.stdout.replace(" ", ""), second
    refused = (tmp_path / "again.out").read_text()
    assert refused.count("group 'train' at http://127.0.0.1:") == 4, refused
    assert refused.count("finished at offset") == 4, refused
    assert refused.count("run again under another group name") == 4, refused
    assert "all_reduce gave" not in refused and "failed ranks" not in refused, refused
