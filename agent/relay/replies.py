"""What the relay answers a worker: an error with its code's status (``wire.codes``), a
coordinator's error passed on as it came, and the counters of what the relay did."""

from __future__ import annotations

import threading
from typing import Any

from ...wire.codes import (
    COORDINATOR_UNAVAILABLE,
    HTTP_ERROR,
    NOT_LEADER,
    error_body,
    status_of,
)
from ..channel import ChannelRefused

#: Statuses of a request refused as a whole: a merged one is retried piece by piece.
REFUSED = frozenset({400, 401, 403, 404, 413, 422})

Body = dict[str, Any]
Reply = tuple[int, Body]


def error(code: str, detail: str, *, default_status: int | None = None) -> Reply:
    """An error with ``code``'s status (``wire.codes``): the relay's own, or one a channel
    answered a batch with, which ``POST /agents/events`` would have answered with that status
    (``default_status`` for a code a newer coordinator sends that this relay does not know)."""
    return status_of(code, default_status), error_body(code, detail)


def passed_on(status: int, code: str, detail: str) -> Reply:
    """A coordinator's error, with the status it came with."""
    return status, error_body(code, detail)


class Counters(dict[str, int]):
    """What the relay did, by name; written by many threads, so under a lock."""

    def __init__(self, *names: str) -> None:
        super().__init__(dict.fromkeys(names, 0))
        self._lock = threading.Lock()

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self[name] += n

    def peak(self, name: str, value: int) -> None:
        """Keep the largest ``value`` seen."""
        with self._lock:
            self[name] = max(self[name], value)

    def reset(self, name: str) -> None:
        with self._lock:
            self[name] = 0


def unreachable(where: str, exc: BaseException) -> str:
    return f"no coordinator answered at {where}: {type(exc).__name__}: {exc}"


def refused(exc: ChannelRefused, where: str) -> Reply:
    """What a worker gets for a refused opening: the coordinator's status and error body; a
    ``not_leader`` left after following the redirects means no coordinator leads."""
    body = exc.body
    if not isinstance(body, dict) or not isinstance(body.get("error"), str):
        return passed_on(exc.status, HTTP_ERROR, str(body)[:200])
    if body["error"] == NOT_LEADER:
        return error(
            COORDINATOR_UNAVAILABLE, f"no coordinator of {where} leads: {body.get('detail')}"
        )
    return exc.status, {"error": body["error"], "detail": str(body.get("detail", ""))}
