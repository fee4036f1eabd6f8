"""The OpenAPI document tells the truth: schemathesis against a running server finds nothing.

``schemathesis run --checks all`` generates requests from ``/openapi.json`` (valid ones,
invalid ones, boundary values, sequences that follow the document's links), sends them to a real
``python -m coordinator serve`` on 127.0.0.1 and checks every answer against the document: no
5xx, only documented statuses, content types and headers, bodies that match their schemas,
valid requests accepted and invalid ones refused, ``Allow`` on 405. The few statuses the
document cannot state as a bound are named, per operation, in ``schemathesis.toml`` beside
this file. One operation is left out: ``GET /agents/channel`` opens a WebSocket, and every
request a schema-driven HTTP client can send it, valid or not, is answered ``426
upgrade_required`` by design; its openings are tested in ``test_channel.py``.

Bounded: a fixed seed, ``FOLDPLANE_SCHEMATHESIS_EXAMPLES`` examples per operation (default 20)
and ``FOLDPLANE_SCHEMATHESIS_MAX_S`` seconds in all (default 150).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.service.conftest import make_server

HERE = Path(__file__).resolve().parent
EXAMPLES = int(os.environ.get("FOLDPLANE_SCHEMATHESIS_EXAMPLES", "20"))
MAX_S = int(os.environ.get("FOLDPLANE_SCHEMATHESIS_MAX_S", "150"))
#: The longest answer the API documents: a long poll or a proposal's ?wait= of 60 s.
LONGEST_ANSWER_S = 65


@pytest.mark.slow
@pytest.mark.timeout(MAX_S + 120)
def test_schemathesis_finds_nothing(tmp_path):
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    assert cli, "schemathesis is part of the dev extra: pip install -e '.[dev]'"
    srv = make_server(tmp_path).start()
    try:
        command = [
            cli,
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "--no-color",
            "run",
            f"{srv.url}/openapi.json",
            "--checks",
            "all",
            "--max-examples",
            str(EXAMPLES),
            "--max-time",
            str(MAX_S),
            "--seed",
            os.environ.get("FOLDPLANE_SCHEMATHESIS_SEED", "16"),
            "--workers",
            "1",  # Python's ast.parse is not thread-safe on 3.11, and hypothesis calls it
            "--request-timeout",
            str(LONGEST_ANSWER_S),
            "--max-response-time",
            str(LONGEST_ANSWER_S),
            "--generation-database",
            "none",
            "--exclude-path",
            "/agents/channel",  # a WebSocket opening (see the module docstring)
            "--suppress-health-check",
            "all",
        ]
        done = subprocess.run(
            command,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=MAX_S + 90,
        )
        report = done.stdout[-20000:] + done.stderr[-5000:]
        assert done.returncode == 0, report
        assert httpx.get(srv.url + "/healthz").status_code == 200
    finally:
        srv.stop()
    assert "Traceback" not in srv.output(), srv.output()[-5000:]
