"""What differs between a coordinator that leads for good and one that leads only while it
holds a lease: a :class:`Role` the :class:`~coordinator.host.loop.Host` defers to.

The host calls the role when it starts, before and after each long poll, and when it closes;
the role drives the host only through its public methods (``serve``, ``stop_serving``,
``catch_up``, ``set_unavailable``, ``projections``). :class:`SoleLeader` is the role of a
SQLite log's one coordinator; ``coordinator.host.replica.Replica`` is a PostgreSQL log's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from coordinator.host.loop import Host


class Role(Protocol):
    #: "leader" or "standby"
    name: str
    #: the leader's address when this coordinator knows it and does not lead
    leader: str | None

    def attach(self, host: Host) -> None:
        """The host this role drives (called once, when the host is built)."""

    def start(self) -> None:
        """Start: serve at once, or follow until leading."""

    def check_polls(self, why: str) -> None:
        """Raise the reason long polls cannot be answered here (``why`` names the moment)."""

    async def stop(self) -> None:
        """The host is closing: stop whatever the role runs."""

    async def closed(self) -> None:
        """The host is closed: release what the role holds."""


class SoleLeader:
    """The only coordinator of its log: it claimed the term on open and serves at once."""

    name = "leader"
    leader: str | None = None

    def __init__(self) -> None:
        self.host: Host | None = None

    def attach(self, host: Host) -> None:
        self.host = host

    def start(self) -> None:
        assert self.host is not None
        self.host.serve()

    def check_polls(self, why: str) -> None:
        return None

    async def stop(self) -> None:
        return None

    async def closed(self) -> None:
        return None
