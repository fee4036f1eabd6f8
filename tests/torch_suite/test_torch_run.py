"""``scripts/torch-run`` counts a suite as pytest does, a module skipped whole included, and
names every failure with its message."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    loader = importlib.machinery.SourceFileLoader("torch_run", str(ROOT / "scripts" / "torch-run"))
    spec = importlib.util.spec_from_loader("torch_run", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_a_run_counts_passes_failures_and_a_module_skipped_at_collection(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(
        "def test_passes():\n    pass\n\ndef test_fails():\n    assert 1 == 2, 'one is not two'\n"
    )
    (tmp_path / "test_skipped_whole.py").write_text(
        "import pytest\n\npytest.skip('not on this torch', allow_module_level=True)\n"
    )
    run = _script().suite(
        Path(sys.executable),
        "t",
        [str(tmp_path), "-ra", "-p", "no:xdist", "-p", "no:randomly"],
        120,
    )
    assert run["counts"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}, run
    assert run["exit_code"] == 1 and run["cut_at_limit_s"] is None
    [failure] = run["failures"]
    assert failure["test"].endswith("test_some.py::test_fails")
    assert "one is not two" in failure["error"]
