"""``python -m coordinator`` — see :mod:`coordinator.cli`."""

from foldplane.coordinator.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
