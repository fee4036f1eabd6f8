"""How this process's command was started, so that its help and its hints name a command that
works where it runs: the console script a wheel installs (``foldplane-coordinator``,
``foldplane-launch``), ``python -m foldplane.coordinator`` (anywhere), or the repository
root's short door (``python -m coordinator``). Reads ``sys.argv`` and ``__main__``; no I/O.
"""

from __future__ import annotations

import os
import sys


def invoked_as(module: str, script: str) -> str:
    """The command line that started this program, for ``module`` (``foldplane.coordinator``)
    and its console ``script`` (``foldplane-coordinator``): ``python -m NAME`` with the name
    the interpreter ran (``foldplane.coordinator``, or ``coordinator`` in the repository's
    root), the script's own name when it was started by it, and ``python -m MODULE`` (which
    works wherever foldplane is installed) when neither is known, as when a test or another
    program calls the entry point."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str):
        name = name.removesuffix(".__main__")
        if name in (module, module.removeprefix("foldplane.")):
            return f"python -m {name}"
    if os.path.basename(sys.argv[0] if sys.argv else "") == script:
        return script
    return f"python -m {module}"
