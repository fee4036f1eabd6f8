"""The layering rules, checked by a tool rather than by memory."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pure_machines_import_no_io() -> None:
    """The fold and the agent machine import no asyncio, threads, sockets, clocks, databases or torch."""
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "broken" in done.stdout and "0 broken" in done.stdout, done.stdout


#: What a process that imports only the pure machines must not have loaded.
IO_MODULES = (
    "asyncio",
    "threading",
    "sqlite3",
    "asyncpg",
    "sqlalchemy",
    "httpx",
    "fastapi",
    "torch",
)


def test_importing_the_pure_machines_loads_no_io_module() -> None:
    """Importing ``coordinator.fold.machine`` and ``agent.machine`` (packages included), and
    making a fold (which loads every facet's declaration and fold parts), loads no I/O.

    import-linter checks the machines' own imports; this checks what the packages'
    ``__init__`` modules drag in at run time, in a fresh interpreter.
    """
    code = (
        "import foldplane.coordinator.fold.machine, foldplane.agent.machine, sys; "
        # a fold loads every registered facet's declaration and fold parts
        "foldplane.coordinator.fold.machine.Coordinator(); "
        f"print(','.join(m for m in {IO_MODULES!r} if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded = [m for m in done.stdout.strip().split(",") if m]
    assert loaded == [], f"importing the pure machines loaded {loaded}"


#: The files the fold's rules live in, each with a docstring that states its rule.
RULE_FILES = (
    "fencing",
    "ranks",
    "healthy_set",
    "budget",
    "proposals",
    "barrier",
    "deadlines",
    "ending",
)


def test_the_coordinator_is_a_dispatcher_over_files_that_state_their_rules() -> None:
    """``machine.py`` dispatches and stays short; a rule is found from the tree alone."""
    fold = ROOT / "coordinator" / "fold"
    assert len((fold / "machine.py").read_text().splitlines()) <= 300
    for name in RULE_FILES:
        doc = ast.get_docstring(ast.parse((fold / f"{name}.py").read_text()))
        assert doc and len(doc.splitlines()) >= 3, f"coordinator/fold/{name}.py states no rule"


def test_the_contracts_cover_the_agent_and_the_benchmarks() -> None:
    """No import loop among the agent's modules nor the benchmarks'; the benchmarks, which
    measure the product, import no tests and no command-line internals."""
    import tomllib

    linter = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    assert linter["root_packages"] == ["foldplane"]
    contracts = linter["contracts"]
    acyclic = [c for c in contracts if c["type"] == "acyclic_siblings"]
    ancestors = {a for c in acyclic for a in c["ancestors"]}
    assert {"foldplane.agent", "foldplane.benchmarks", "foldplane.benchmarks.kit"} <= ancestors
    forbidden = [
        set(c["forbidden_modules"])
        for c in contracts
        if c["type"] == "forbidden" and c["source_modules"] == ["foldplane.benchmarks"]
    ]
    assert any({"tests", "foldplane.coordinator.cli"} <= f for f in forbidden), forbidden
