"""The install says what the code uses: ``pip install foldplane`` is the worker side (``agent/``,
``wire/``), ``foldplane[server]`` adds the coordinator, and ``[dev]`` has both.

The imports are read from the source (every ``import``, also the ones inside functions), the
dependencies from pyproject.toml.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

from foldplane.cli import SERVER_MODULES

ROOT = Path(__file__).resolve().parent.parent
LOCAL = {"foldplane", "eventlog", "coordinator", "agent", "api", "wire", "migrations", "benchmarks", "tests"}
#: Modules a declared distribution brings along and the code imports directly.
PROVIDED_BY = {"starlette": "fastapi", "grpc": "grpcio"}
#: What a worker must not be made to install.
SERVER_ONLY = {"fastapi", "uvicorn", "sqlalchemy", "asyncpg", "alembic", "prometheus_client", "grpcio"}


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _names(requirements: list[str]) -> set[str]:
    """Distribution names, normalized to the module spelling (``prometheus-client`` ->
    ``prometheus_client``), extras and markers left out."""
    names = set()
    for req in requirements:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", req.strip())
        assert match, req
        names.add(match.group(0).lower().replace("-", "_").replace(".", "_"))
    return names


def _third_party_imports(*packages: str) -> dict[str, set[str]]:
    """Top-level third-party module -> the files that import it."""
    found: dict[str, set[str]] = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in LOCAL:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def _uncovered(imports: dict[str, set[str]], declared: set[str]) -> dict[str, set[str]]:
    return {m: f for m, f in imports.items() if PROVIDED_BY.get(m, m) not in declared}


def test_the_base_install_covers_the_worker_side_and_nothing_of_the_server() -> None:
    base = _names(_project()["dependencies"])
    worker = _third_party_imports("agent", "wire")
    assert {"torch", "httpx", "msgspec"} <= set(worker), worker  # the walk sees the imports
    assert _uncovered(worker, base) == {}
    assert base & SERVER_ONLY == set(), base & SERVER_ONLY
    assert "numpy" in base  # torch warns on import without it


def test_the_server_extra_covers_the_coordinator_and_dev_includes_it() -> None:
    project = _project()
    extras = project["optional-dependencies"]
    server = _names(project["dependencies"]) | _names(extras["server"])
    imports = _third_party_imports("coordinator", "api", "eventlog", "migrations")
    # replay --plot is its own extra (``plot``), in [dev] too
    imports.pop("matplotlib", None)
    assert _uncovered(imports, server) == {}
    assert _names(extras["server"]) >= SERVER_ONLY
    assert "foldplane[server]" in extras["dev"]
    # what the CLI recognizes as "the server extra is missing"
    modules = {m for m, dist in PROVIDED_BY.items() if dist in _names(extras["server"])}
    assert (_names(extras["server"]) - set(PROVIDED_BY.values())) | modules <= SERVER_MODULES


def _cli_without_server(*argv: str) -> subprocess.CompletedProcess[str]:
    """``python -m coordinator ARGV`` in an interpreter where the server's packages cannot be
    imported (``None`` in ``sys.modules`` makes ``import`` raise, as if they were not installed)."""
    code = (
        "import sys\n"
        f"for m in {sorted(SERVER_MODULES)!r}:\n"
        "    sys.modules[m] = None\n"
        "from foldplane.cli import main\n"
        f"sys.exit(main({list(argv)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_the_server_commands_name_the_extra_when_it_is_not_installed(tmp_path) -> None:
    for argv in (
        ["serve", "--db", str(tmp_path / "log.db"), "--store-port", "-1"],
        ["replay", str(tmp_path / "log.db")],
        ["demo"],
    ):
        done = _cli_without_server(*argv)
        assert done.returncode == 2, (argv, done.stdout, done.stderr)
        assert "pip install 'foldplane[server]'" in done.stderr, (argv, done.stderr)
        assert "Traceback" not in done.stderr, (argv, done.stderr)
    assert not (tmp_path / "log.db").exists()
    token = _cli_without_server("token", "--group", "g", "--rank", "0", "--secret", "s")
    assert token.returncode == 0 and token.stdout.startswith("fpa1.g.0."), token


def test_importing_torch_does_not_warn_about_numpy() -> None:
    done = subprocess.run(
        [sys.executable, "-W", "always", "-c", "import torch; torch.zeros(1).numpy()"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "NumPy" not in done.stderr, done.stderr
