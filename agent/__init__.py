"""The in-process agent: a pure state machine (``agent.machine``) run by a host thread
(``agent.host``), and the torch data plane it drives.

>>> from foldplane.agent import Agent
>>> agent = Agent("http://127.0.0.1:8470", group="train", rank=0).start()

The host (threads, HTTP, torch) is imported lazily, on first use of one of its names, so that
importing the pure :mod:`agent.machine` loads none of them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .events import EventRefused
    from .host import Agent, AgentStopped
    from .machine import View

_LAZY = {
    "Agent": "foldplane.agent.host",
    "AgentStopped": "foldplane.agent.host",
    "EventRefused": "foldplane.agent.events",
    "View": "foldplane.agent.machine",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'agent' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = ["Agent", "AgentStopped", "EventRefused", "View"]
