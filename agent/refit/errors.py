"""What the refit data plane raises: a failed transfer (naming who died), a closed world; and
the coordinator's verdict it reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Peer:
    """One member of a refit world: a slot of the publisher or of the subscriber mesh."""

    side: str
    slot: int

    def __str__(self) -> str:
        return f"{self.side} slot {self.slot}"


@dataclass(frozen=True)
class Verdict:
    """The coordinator's word that a refit world's epoch is over: why (``reason``), and the
    members it took OFFLINE (``dead``), if that is why."""

    reason: str
    dead: tuple[Peer, ...] = ()


class RefitError(RuntimeError):
    """A refit world could not be used: bad arguments for this plan, or a closed world."""


class RefitClosed(RefitError):
    """The world was closed (after a failure, or by ``close()``); a new attempt needs a new world."""


class RefitFailed(RefitError):
    """A transfer (or the world's formation) failed; the world is closed.

    ``dead`` names the members found dead (their liveness counter stopped) where that is known,
    ``reason`` the first error seen, ``transfer`` the transfer's number in its world (0 while
    forming). Every member that sees the failure raises it; the store carries the first notice
    to the members that would otherwise wait for their deadline.
    """

    def __init__(self, transfer: int, dead: tuple[Peer, ...], reason: str) -> None:
        self.transfer = transfer
        self.dead = dead
        self.reason = reason
        who = f"{', '.join(map(str, dead))} dead" if dead else "no member found dead"
        what = f"refit transfer {transfer}" if transfer else "refit world formation"
        super().__init__(f"{what} failed: {who}; {reason}")
