"""The in-process agent: a pure state machine (``agent.machine``) run by a host thread
(``agent.host``), and the torch data plane it drives.

>>> from agent import Agent
>>> agent = Agent("http://127.0.0.1:8470", group="train", rank=0).start()
"""

from agent.host import Agent, AgentStopped
from agent.machine import View

__all__ = ["Agent", "AgentStopped", "View"]
