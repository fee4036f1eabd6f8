"""The coordinator's command lines, for the processes that start one: the demo, the benchmarks
and the tests (``cli.py`` parses them)."""

from __future__ import annotations

import sys


def serve_argv(db: str, port: int, *options: str) -> list[str]:
    """The command line of ``python -m coordinator serve --db DB --port PORT [options]`` under
    this interpreter: how the demo, the benchmarks and the tests start a coordinator process."""
    return [sys.executable, "-m", "foldplane.coordinator", "serve", "--db", db, "--port", str(port), *options]
