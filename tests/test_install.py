"""What foldplane installs does not collide with a user's own modules.

A user's folder holds its own ``agent.py``, ``api/``, ``wire.py`` and ``eventlog.py`` (two of them
fail when imported, two define something else under foldplane's old top-level names). From that
folder as the working directory (first on ``sys.path``), a real coordinator serves (``python -m
foldplane.coordinator serve``), the README's worker snippet runs as two real worker processes, the
console page is served and the log replays (slow: against foldplane installed editable, this
checkout's ``.venv``, and from a wheel built here into a fresh virtual environment that already
holds a torch, which the install must leave in place). The default suite checks, from the same
folder, that every side of the editable install imports and its command answers.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
#: The top-level names foldplane's folders had before they were installed under ``foldplane``.
FOLDERS = ("agent", "api", "benchmarks", "coordinator", "eventlog", "migrations", "wire")
USER_FILES = {
    "agent.py": 'raise RuntimeError("the user\'s own agent.py was imported")\n',
    "api/__init__.py": 'raise RuntimeError("the user\'s own api package was imported")\n',
    "api/limits.py": "LIMIT = 3  # the user's own\n",
    "wire.py": "FORMAT = 'the user\\'s own wire format'\n",
    "eventlog.py": "EVENTS: list[str] = []  # the user's own event log\n",
}
#: Fast failure detection for the group; the deadlines fail a broken run soon.
GROUP = {"heartbeat_timeout_s": 3.0, "formation_timeout_s": 60.0, "admission_timeout_s": 20.0}


def user_folder(tmp: Path) -> Path:
    folder = tmp / "user"
    for name, text in USER_FILES.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def readme_worker(url: str) -> str:
    """The README's worker snippet (the Python block with ``Agent(``), pointed at ``url``, with
    ``rank`` from the command line."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    snippet = next(b for b in blocks if "Agent(" in b and "from foldplane.agent import" in b)
    snippet = re.sub(r"http://(?:127\.0\.0\.1|localhost):\d+", url, snippet)
    return "import sys\nrank = int(sys.argv[1])\n" + snippet


def _running(process: subprocess.Popen[str], lines: list[str], up: threading.Event) -> None:
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if "Uvicorn running on" in line:
            up.set()
    up.set()  # exited: the caller sees it in poll()


def run_from_user_folder(python: str, folder: Path) -> None:
    """A coordinator, the README's worker as 2 ranks, the console and a replay, all started with
    ``folder`` as the working directory."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [python, "-m", "foldplane.coordinator", "serve", "--db", "train.db", "--host",
         "127.0.0.1", "--port", str(port), "--store-port", "0"],
        cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    lines: list[str] = []
    up = threading.Event()
    threading.Thread(target=_running, args=(server, lines, up), daemon=True).start()
    try:
        assert up.wait(90) and server.poll() is None, "coordinator did not start:\n" + "".join(
            lines
        )
        with httpx.Client(base_url=url, timeout=30) as http:
            made = http.post("/groups", json={"group": "train", "world_size": 2, **GROUP})
            assert made.status_code in (200, 201), made.text
            (folder / "train.py").write_text(readme_worker(url))
            workers = [
                subprocess.Popen(
                    [python, "train.py", str(rank)],
                    cwd=folder,
                    env={**env, "RANK": str(rank), "PYTHONUNBUFFERED": "1"},
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )  # fmt: skip
                for rank in range(2)
            ]
            # the README's step 4: once every rank said it reduced on view 1, a proposal changes
            # the view, which the worker waits for before it leaves
            first = {}
            for rank, worker in enumerate(workers):
                assert worker.stdout is not None
                first[rank] = worker.stdout.readline()
                assert "all_reduce gave 2" in first[rank], f"rank {rank}: {first[rank]!r}"
            changed = http.post(
                "/proposals",
                params={"wait": 30},
                json={"group": "train", "op": "deactivate", "ranks": [1]},
            )
            assert changed.status_code == 200, changed.text
            for rank, worker in enumerate(workers):
                out, _ = worker.communicate(timeout=180)
                assert worker.returncode == 0, f"rank {rank}:\n{first[rank]}{out}"
            views = http.get("/views/history", params={"group": "train"})
            assert views.status_code == 200, views.text
            assert views.json(), "no view committed"
            console = http.get("/ui")
            assert console.status_code == 200 and "<html" in console.text.lower(), console.text
            # the facets' panels are package data of their folders, installed with them
            assert 'id="data-panel"' in console.text and 'id="refit-panel"' in console.text
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    replay = subprocess.run(
        [python, "-m", "foldplane.coordinator", "replay", "train.db"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert replay.returncode == 0, replay.stdout + replay.stderr


def installed(python: str, cwd: Path) -> dict[str, str | None]:
    """Where ``python`` finds ``foldplane.agent`` and each old top-level name (None: nowhere)."""
    code = (
        "import importlib.util, json, foldplane.agent\n"
        f"names = {list(FOLDERS)!r}\n"
        "found = {n: getattr(importlib.util.find_spec(n), 'origin', None) for n in names}\n"
        "print(json.dumps({'foldplane.agent': foldplane.agent.__file__, **found}))\n"
    )
    done = subprocess.run(
        [python, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{python} does not import foldplane from {cwd}:\n{done.stderr}"
    return json.loads(done.stdout)


def test_a_users_own_modules_beside_the_script_do_not_break_an_editable_install(
    tmp_path: Path,
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    where = installed(sys.executable, elsewhere)
    assert Path(where.pop("foldplane.agent")).resolve() == ROOT / "agent" / "__init__.py", (
        "foldplane is not installed editable from this checkout: "
        "pip install -c constraints-dev.txt -e '.[dev]'"
    )
    assert where == dict.fromkeys(FOLDERS), f"installed at top level: {where}"
    # from the user's folder (first on sys.path) every side of foldplane imports, its commands
    # answer, and the user's files are what the user's own names import
    folder = user_folder(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
    code = (
        "import foldplane.agent, foldplane.agent.dataplane, foldplane.api.app, foldplane.cli\n"
        "import wire, eventlog\n"
        "print(wire.FORMAT, len(eventlog.EVENTS))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "the user's own wire format 0", done.stdout
    helped = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "serve", "--help"], cwd=folder, env=env,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert helped.returncode == 0 and "--db" in helped.stdout, helped.stdout + helped.stderr


def test_pip_would_install_foldplane_beside_the_torch_this_environment_has(tmp_path: Path) -> None:
    """``pip install --dry-run --report`` of this checkout with its server extra, into this
    interpreter's environment (torch 2.14.1 in the README's ``.venv``, 2.13.0 in ``.venv-2.13``),
    with no constraints file (not the machine's either) and no index beyond the wheels on disk:
    what pip would install holds no torch and nothing of torch's, so the user's torch stays.
    (A cap below the installed torch makes pip pick an older torch here, or fail to find one.)"""
    import torch

    report = tmp_path / "report.json"
    env = os.environ | {"PIP_CONSTRAINT": "/dev/null"}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--no-index",
         "--quiet", "--report", str(report), f"{ROOT}[server]"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    names = {item["metadata"]["name"].lower() for item in json.loads(report.read_text())["install"]}
    assert "foldplane" in names, names
    assert not {n for n in names if n.startswith(("torch", "nvidia-", "triton"))}, (
        f"installing foldplane would replace torch {torch.__version__}: {sorted(names)}"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_an_editable_install_serves_the_readmes_worker_from_a_users_folder(
    tmp_path: Path,
) -> None:
    """The same folder as the working directory of a real coordinator, the README's worker as
    two processes, the console and a replay (the wheel's twin below runs the same)."""
    run_from_user_folder(sys.executable, user_folder(tmp_path))


@pytest.mark.slow
@pytest.mark.timeout(1500)  # installing torch into a new environment takes minutes
def test_the_wheel_keeps_the_users_torch_and_a_users_own_modules_do_not_break_it(
    tmp_path: Path,
) -> None:
    """A new environment that already has this interpreter's torch (2.14.1 in the README's
    ``.venv``), as a user's has: foldplane's wheel, built with ``pip wheel`` and installed with
    its server extra by a plain ``pip install`` (no constraints file), leaves that torch in
    place (foldplane declares no upper bound), and runs from the user's folder."""
    import torch

    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         str(ROOT), "-w", str(dist)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("foldplane-*.whl")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = str(venv / "bin" / "python")
    # the distribution's version (2.14.1), not torch.__version__ (2.14.1+cu130: a CUDA wheel
    # adds its build's label at run time, which the machine's pip constraint torch<=2.14.1 and
    # the registry's file names do not carry)
    subprocess.run(
        [python, "-m", "pip", "install", "-q", f"torch=={importlib.metadata.version('torch')}"],
        check=True, capture_output=True, timeout=1200,
    )  # fmt: skip
    before = torch_in(python)
    assert before == torch.__version__
    done = subprocess.run(
        [python, "-m", "pip", "install", f"{wheel}[server]"],
        capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert torch_in(python) == before, f"installing foldplane replaced torch {before}"
    assert not re.search(r"Uninstalling torch|Successfully installed.* torch-", done.stdout), (
        done.stdout
    )
    where = installed(python, tmp_path)
    assert Path(where.pop("foldplane.agent")).is_relative_to(venv), where
    assert where == dict.fromkeys(FOLDERS), f"installed at top level: {where}"
    assert (venv / "bin" / "foldplane-coordinator").exists()
    run_from_user_folder(python, user_folder(tmp_path))


def torch_in(python: str) -> str:
    """The version of the torch that ``python`` imports."""
    done = subprocess.run(
        [python, "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()
