"""Every benchmark, by name, and the module that runs it: the modules of ``benchmarks/`` and
those the facets declare in their folders (their plugins' ``benchmarks``, read through the
facet list, ``coordinator/fold/registry.py``), so the benchmark kit names no facet:
``python -m benchmarks`` runs them all alike and ``benchmarks.report`` describes each from its
module's docstring."""

from __future__ import annotations

import importlib.util
import pkgutil
from pathlib import Path

from ...coordinator.fold import registry

#: The modules of ``benchmarks/`` that are not benchmarks.
NOT_BENCHES = frozenset({"harness", "report", "__main__"})
_PACKAGE = "foldplane.benchmarks"


def benchmarks(packages: str | None = None) -> dict[str, str]:
    """Every benchmark's name and module, sorted by name: a module of ``benchmarks/`` (``kit``,
    a package, is what they share) or one a facet declares (of the built-in facets and
    ``packages``, a deployment's own as ``FOLDPLANE_FACETS`` names them). Two of one name are a
    ValueError naming both."""
    here = importlib.util.find_spec(_PACKAGE)
    assert here is not None and here.submodule_search_locations is not None
    found = {
        m.name: f"{_PACKAGE}.{m.name}"
        for m in pkgutil.iter_modules(here.submodule_search_locations)
        if not m.ispkg and m.name not in NOT_BENCHES and not m.name.startswith("_")
    }
    for plugin in registry.Facets(packages).plugins:
        for name, module in plugin.benchmarks.items():
            if name in found:
                raise ValueError(
                    f"benchmark {name!r} of facet {plugin.name!r} ({module}) is also {found[name]}"
                )
            found[name] = module
    return dict(sorted(found.items()))


def source(module: str) -> Path:
    """The file of a benchmark's module, found without importing it."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise ValueError(f"no benchmark module {module!r}")
    return Path(spec.origin)
