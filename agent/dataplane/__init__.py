"""The torch data plane: one process group per committed view, and ``failed_ranks_hint``.

See ``docs/dataplane.md``. The agent creates a :class:`DataPlane`, installs each committed view,
and hands :meth:`DataPlane.process_group` to the training loop.
"""

from .errors import DataPlaneError, PeerFailure
from .group import ElasticProcessGroup
from .plane import DataPlane
from .work import Work

__all__ = ["DataPlane", "DataPlaneError", "ElasticProcessGroup", "PeerFailure", "Work"]

from . import c10d as _c10d  # noqa: E402  (registers the "foldplane" backend)

_c10d.register()
