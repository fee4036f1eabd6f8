"""foldplane: an event-sourced control plane for elastic torch.distributed process groups.

Every module is imported under this one name (``foldplane.agent``, ``foldplane.coordinator``,
``foldplane.api``, ``foldplane.eventlog``, ``foldplane.migrations``, ``foldplane.wire``,
``foldplane.benchmarks``), so a user's own ``agent.py``, ``api/``, ``wire.py`` or ``eventlog.py``
beside a training script cannot take a foldplane module's place.

The repository keeps those folders at its top: here they are links (``agent -> ../agent``), so
Python and the import contracts (import-linter walks the links) see one package. An installed
wheel holds the folders themselves (setup.py maps each to ``foldplane.<folder>``).
"""

from __future__ import annotations

from pathlib import Path

# A copy that turned the links into plain files (git with core.symlinks off) still works: the
# folders are found one level up.
_here = Path(__file__).resolve().parent
if not (_here / "agent").is_dir() and (_here.parent / "agent" / "__init__.py").is_file():
    __path__.append(str(_here.parent))  # noqa: F821  (a package's __path__ is set before this runs)
