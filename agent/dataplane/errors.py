"""The one exception the data plane raises: local misuse, never a peer's failure."""

from __future__ import annotations


class DataPlaneError(RuntimeError):
    """A local misuse of the data plane: a closed group, no view installed yet, a conflicting view.

    A peer's failure is never raised; it is reported by ``Work.wait() == False`` and the hint.
    Bad arguments (a rank out of range, a wrong tensor list) raise ``ValueError``/``TypeError``.
    """
