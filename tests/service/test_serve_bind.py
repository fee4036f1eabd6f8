"""``serve`` says "serving" only once its port is bound: on a port in use it fails without it."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

from foldplane.coordinator.commands import serve_argv
from tests.service.conftest import ROOT


def test_a_port_in_use_fails_the_start_without_saying_serving(tmp_path: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run(
            serve_argv(str(tmp_path / "log.db"), port, "--store-port", "-1"),
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    said = run.stdout + run.stderr
    assert run.returncode != 0, said
    assert "address already in use" in said.lower(), said
    assert "serving" not in said, said


def test_twin_a_free_port_says_serving(tmp_path: Path):
    from tests.service.conftest import make_server

    srv = make_server(tmp_path, args=["--log-level", "info"]).start()
    try:
        assert f"serving {tmp_path / 'log.db'} on http://127.0.0.1:{srv.port}" in srv.output()
    finally:
        srv.stop()
