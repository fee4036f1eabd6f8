"""The torch data plane: one process group per committed view, and ``failed_ranks_hint``.

See ``docs/dataplane.md``. The agent creates a :class:`DataPlane`, installs each committed view,
and hands :meth:`DataPlane.process_group` to the training loop.
"""

from foldplane.agent.dataplane.errors import DataPlaneError, PeerFailure
from foldplane.agent.dataplane.group import ElasticProcessGroup
from foldplane.agent.dataplane.plane import DataPlane
from foldplane.agent.dataplane.work import Work

__all__ = ["DataPlane", "DataPlaneError", "ElasticProcessGroup", "PeerFailure", "Work"]

from foldplane.agent.dataplane import c10d as _c10d  # noqa: E402  (registers the "foldplane" backend)

_c10d.register()
