"""The torch data plane: one process group per committed view, and ``failed_ranks_hint``.

See ``docs/dataplane.md``. The agent creates a :class:`DataPlane`, installs each committed view,
and hands :meth:`DataPlane.process_group` to the training loop. Importing it with a torch
outside the tested range warns once (:mod:`agent.torch_range`).
"""

import torch as _torch

from .. import torch_range as _torch_range
from .errors import DataPlaneError, PeerFailure
from .group import ElasticProcessGroup
from .plane import DataPlane
from .work import Work

__all__ = ["DataPlane", "DataPlaneError", "ElasticProcessGroup", "PeerFailure", "Work"]

from . import c10d as _c10d  # noqa: E402  (registers the "foldplane" backend)

_c10d.register()
_torch_range.warn_if_untested(_torch.__version__)
