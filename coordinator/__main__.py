"""``python -m coordinator`` — see :mod:`coordinator.cli`."""

import os
import sys

from coordinator.cli import main

if __name__ == "__main__":
    if os.environ.get("FOLDPLANE_TRACE"):
        sys.path.insert(0, "/tmp/perf")
        import instrument  # noqa: F401
    raise SystemExit(main())
