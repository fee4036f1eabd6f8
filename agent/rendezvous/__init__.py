"""``torchrun --rdzv-backend foldplane``: torch's rendezvous handler on a foldplane coordinator
(docs/torchrun.md).

torchrun finds it through the entry-point group ``torchrun.handlers`` (pyproject.toml names
:func:`torchrun_handler`): when ``torch.distributed.elastic.rendezvous`` is imported, torch
loads every entry point of the group and registers what :func:`torchrun_handler` returns under
its name. That happens in every torchrun of an environment where foldplane is installed, so this
module imports nothing until a handler is made (:func:`create_handler`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def create_handler(params: Any) -> Any:
    """torchrun's ``RendezvousParameters`` -> a ``FoldplaneRendezvousHandler``
    (``handler.py``); a command line it cannot run raises ``ValueError`` saying what to change."""
    from .handler import FoldplaneRendezvousHandler
    from .settings import settings_from

    return FoldplaneRendezvousHandler(settings_from(params))


def torchrun_handler() -> Callable[[Any], Any]:
    """The entry point: torch calls it with no arguments and registers the creator it returns
    (``torch/distributed/elastic/rendezvous/registry.py``)."""
    return create_handler
