"""The ``refits`` facet: weight refits between two groups (docs/refit.md). Registered in
``coordinator/fold/registry.py``."""

from typing import Any


def __getattr__(name: str) -> Any:
    # The declaration names the fold; loaded when the registry asks for it, so that a worker
    # importing this facet's worker modules loads nothing of its server side.
    if name == "PLUGIN":
        from .plugin import PLUGIN

        return PLUGIN
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
