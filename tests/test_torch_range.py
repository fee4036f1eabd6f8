"""A torch outside the tested range gets one warning when foldplane's data plane is imported.

The rule on version strings is checked on its own; the import is checked in fresh interpreters,
once with this environment's torch (in the range: no warning) and once with its
``torch.__version__`` set to 2.99.0 before foldplane's data plane (the first foldplane module that
imports torch) is imported: one warning per process, however many worker modules follow.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from foldplane.agent.torch_range import TESTED, range_text, untested

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    "version",
    [
        "2.11.0+cu130",
        "2.12.1",
        "2.13.0",
        "2.13.0+cpu",
        "2.14.1",
        "2.15.0+cu132",
        "2.15.0.dev20260101+cpu",
        "2.15.3",
    ],
)
def test_a_torch_in_the_range_is_not_warned_about(version: str) -> None:
    assert untested(version) is None


@pytest.mark.parametrize(
    "version",
    [
        "2.10.1",
        "2.10.0+cu128",
        "2.16.0",
        "2.16.0a0+git1234",
        "3.0.0",
        "1.15.0",
        "nightly",
    ],
)
def test_a_torch_outside_the_range_is_named_with_the_range(version: str) -> None:
    message = untested(version)
    assert message is not None
    assert f"torch {version} is installed" in message
    assert "tested with torch 2.11 through 2.15" in message


def test_the_range_is_the_one_the_docs_and_the_install_state() -> None:
    assert TESTED == ((2, 11), (2, 15)) and range_text() == "2.11 through 2.15"
    pyproject = (ROOT / "pyproject.toml").read_text()
    # no upper bound, and a floor under the tested range: an install keeps the user's torch
    assert '"torch>=2.11",' in pyproject
    assert "torch 2.11 through 2.15" in (ROOT / "docs" / "torch-compat.md").read_text()


def _import_the_data_plane(torch_version: str | None = None) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter imports the worker side (``torch.__version__`` set to
    ``torch_version`` first, if given) and prints every warning it saw."""
    code = (
        "import warnings\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    import torch\n"
        + (f"    torch.__version__ = {torch_version!r}\n" if torch_version else "")
        + "    import foldplane.agent.dataplane\n"
        "    from foldplane.agent import Agent\n"
        "    import foldplane.agent.ddp, foldplane.agent.fsdp\n"
        "    foldplane.agent.torch_range.warn_if_untested(torch.__version__)\n"
        "for w in seen:\n"
        "    print(f'{w.category.__name__}: {w.message} ({w.filename})')\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_importing_the_data_plane_with_a_tested_torch_warns_nothing() -> None:
    done = _import_the_data_plane()
    assert done.returncode == 0, done.stderr
    assert "TorchVersionWarning" not in done.stdout, done.stdout


def test_importing_the_data_plane_with_an_untested_torch_warns_once() -> None:
    done = _import_the_data_plane("2.99.0")
    assert done.returncode == 0, done.stderr
    warned = [line for line in done.stdout.splitlines() if "TorchVersionWarning" in line]
    assert len(warned) == 1, done.stdout
    assert warned[0].startswith(
        "TorchVersionWarning: foldplane is tested with torch 2.11 through 2.15, and torch "
        "2.99.0 is installed: it may work, but no suite has run on it "
        "(docs/torch-compat.md#torch-versions) ("
    ), warned
    assert warned[0].endswith("/dataplane/__init__.py)"), warned  # where foldplane imports torch
