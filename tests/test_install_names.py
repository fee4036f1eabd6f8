"""The install's own names: help texts and hints name a command that works where it runs.

After a wheel install there is no ``python -m coordinator`` (that short door exists only in
the repository's root), so the console scripts name themselves, ``python -m
foldplane.coordinator`` names itself, and the root's door keeps its short name. Real
processes, started from a folder outside the repository."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_each_command_s_help_names_the_command_that_started_it(tmp_path: Path):
    for argv, cwd, usage in (
        ([str(BIN / "foldplane-coordinator"), "--help"], tmp_path, "usage: foldplane-coordinator "),
        ([str(BIN / "foldplane-launch"), "--help"], tmp_path, "usage: foldplane-launch "),
        ([sys.executable, "-m", "foldplane.coordinator", "--help"], tmp_path,
         "usage: python -m foldplane.coordinator "),
    ):  # fmt: skip
        done = run(argv, cwd)
        assert done.returncode == 0 and done.stdout.startswith(usage), (argv, done.stdout[:200])
        assert "python -m coordinator" not in done.stdout, done.stdout


def test_a_coordinator_url_without_a_scheme_is_one_line(tmp_path: Path, capsys):
    argv = [str(BIN / "foldplane-coordinator"), "group", "list", "--coordinator", "127.0.0.1:1"]
    done = run(argv, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    assert done.stderr.strip() == (
        "group: coordinator address '127.0.0.1:1' must start with http:// or https://"
    )
    from foldplane.cli import main

    db = tmp_path / "log.db"
    assert main(["serve", "--db", str(db), "--advertise", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == "coordinator: --advertise '127.0.0.1:1' must start with http:// or https://"
    assert not db.exists()  # refused before the log was opened


def test_hints_name_the_command_that_works_where_they_run(monkeypatch):
    """The demo's closing ``replay`` hint and the launcher's ``group end`` hint: the entry point
    called from another program (here, the test) names ``python -m foldplane.coordinator``,
    which works wherever foldplane is installed."""
    from foldplane.agent.invocation import invoked_as

    assert invoked_as("foldplane.coordinator", "foldplane-coordinator") == (
        "python -m foldplane.coordinator"
    )
    monkeypatch.setattr(sys, "argv", ["/venv/bin/foldplane-coordinator", "demo"])
    assert invoked_as("foldplane.coordinator", "foldplane-coordinator") == "foldplane-coordinator"
    source = (ROOT / "agent" / "launch.py").read_text()
    assert "python -m coordinator" not in source
