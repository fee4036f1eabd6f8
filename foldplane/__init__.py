"""foldplane: an event-sourced control plane for elastic torch.distributed process groups.

Every module is imported under this one name (``foldplane.agent``, ``foldplane.coordinator``,
``foldplane.api``, ``foldplane.eventlog``, ``foldplane.migrations``, ``foldplane.wire``,
``foldplane.benchmarks``), so a user's own ``agent.py``, ``api/``, ``wire.py`` or ``eventlog.py``
beside a training script cannot take a foldplane module's place.

The repository keeps those folders at its top. An installed wheel holds them inside this package
(pyproject.toml maps each folder to ``foldplane.<folder>``); in a checkout, or an editable
install, this package has no sub-folders of its own and finds them one level up, beside it.
"""

from __future__ import annotations

from pathlib import Path

_here = Path(__file__).resolve().parent
_checkout = _here.parent
if not (_here / "agent").is_dir() and (_checkout / "agent" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821  (a package's __path__ is set before this runs)
