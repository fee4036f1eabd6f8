"""``python -m coordinator`` in the repository's root: a door to :mod:`foldplane.cli`, the
command line (this module, run as ``__main__``, is the only code the short name loads)."""

from foldplane.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
