"""The notice a rank leaves in the store when a view fails, so every member fails fast.

The first member that sees an operation of view ``v`` fail writes a notice to every member's
``fail/<v>/<rank>`` key; each member's watcher thread is blocked on its own key and wakes at
once, instead of waiting out the backend's timeout. A notice names the rank that sent it and the
ranks it blamed directly (an injected link failure names its peer; a dead rank is found later
from the liveness counters by every member on its own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class PoisonNotice:
    """``by`` saw view ``version`` fail for ``reason`` and blamed ``named`` directly."""

    version: int
    by: int
    named: tuple[int, ...]
    reason: str
    #: The sender gave the view up (it moved to a newer one): no link broke, nothing to report.
    left: bool = False

    def encode(self) -> bytes:
        body = {
            "version": self.version,
            "by": self.by,
            "named": list(self.named),
            "reason": self.reason,
        }
        if self.left:
            body["left"] = True
        return json.dumps(body, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> PoisonNotice:
        """Parse a notice; a damaged one raises ``ValueError`` naming what is wrong."""
        try:
            body = json.loads(raw)
            return cls(
                version=int(body["version"]),
                by=int(body["by"]),
                named=tuple(int(r) for r in body["named"]),
                reason=str(body["reason"]),
                left=bool(body.get("left", False)),
            )
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"malformed poison notice {raw[:200]!r}: {e}") from e

    @classmethod
    def read(cls, version: int, raw: bytes) -> PoisonNotice:
        """The notice a watcher of view ``version`` found; a damaged one still fails the view,
        blaming nobody and saying why."""
        try:
            return cls.decode(raw)
        except ValueError as e:
            return cls(version, -1, (), f"unreadable poison notice ({e})")

    def blamed_by(self, rank: int) -> tuple[int, ...]:
        """The ranks ``rank`` blames on this notice.

        A link has two ends: the rank the notice names blames the sender; every other member
        adopts the sender's names, so that survivors report one consistent hint.
        """
        if rank in self.named:
            return (self.by,)
        return self.named
