"""Simulated agents that follow the leader through the product's own client.

:class:`AgentHost` carries every rank of one group, as one node's agent host would: it joins the
ranks once, reports their links, heartbeats them in batches, and long-polls each rank's updates
after the last offset it processed, ACKing every ``view_prepare`` it takes part in. All calls go
through ``agent.client.CoordinatorClient`` over the list of coordinator addresses, so a failover
is followed exactly as a real agent follows it (``503 not_leader`` names the leader; a refused
connection moves on to the next address). An agent backs off and retries when no coordinator
answers; it never joins again.

It keeps an audit trail: every write the coordinator acknowledged (offset and event), every
committed view each rank saw, every error.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agent.client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable

#: A short request timeout, so a call to a frozen coordinator moves on quickly.
REQUEST_TIMEOUT_S = 1.0
POLL_TIMEOUT_S = 2.0
RETRY_S = 0.05


@dataclass(frozen=True)
class Acked:
    """A write the coordinator acknowledged: it is durable at ``offset``."""

    offset: int
    event: dict[str, Any]
    at: float  # time.monotonic() when the answer arrived


class AgentHost:
    def __init__(
        self, addresses: list[str], group: str, world_size: int, heartbeat_s: float = 0.1
    ) -> None:
        self.addresses = addresses
        self.group = group
        self.ranks = list(range(world_size))
        self.heartbeat_s = heartbeat_s
        self.incarnation = {r: uuid.uuid4().hex for r in self.ranks}
        self.acked: list[Acked] = []
        self.refused: list[tuple[dict[str, Any], dict[str, Any]]] = []
        self.failures: list[str] = []
        self.joins = 0
        self.committed: dict[int, list[int]] = {r: [] for r in self.ranks}
        self.resyncs = 0
        self._lock = threading.Condition()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # -- sending ---------------------------------------------------------------------------------

    def _event(self, type_: str, rank: int, **fields: Any) -> dict[str, Any]:
        return {
            "type": type_,
            "group": self.group,
            "rank": rank,
            "incarnation": self.incarnation[rank],
            **fields,
        }

    def send(self, client: CoordinatorClient, events: list[dict[str, Any]]) -> bool:
        """POST a batch; record what was acknowledged. False when no coordinator answered."""
        try:
            results = client.post_events(events)
        except (CoordinatorUnavailable, CoordinatorError) as exc:
            with self._lock:
                self.failures.append(f"{time.monotonic():.3f} {exc}")
            return False
        now = time.monotonic()
        with self._lock:
            for event, result in zip(events, results, strict=True):
                if "offset" in result and "error" not in result:
                    self.acked.append(Acked(result["offset"], event, now))
                else:
                    self.refused.append((event, result))
        return True

    def start(self) -> AgentHost:
        client = self._client()
        while not self.send(
            client, [self._event("join", r, host="sim", pid=1) for r in self.ranks]
        ):
            time.sleep(RETRY_S)
        self.joins += 1
        links = [
            self._event(
                "links",
                r,
                peers={str(p): "up" for p in self.ranks if p != r},
                self_ready=True,
            )
            for r in self.ranks
        ]
        while not self.send(client, links):
            time.sleep(RETRY_S)
        client.close()
        self._spawn(self._beat)
        for rank in self.ranks:
            self._spawn(self._follow, rank)
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=POLL_TIMEOUT_S + REQUEST_TIMEOUT_S + 5)

    def _client(self) -> CoordinatorClient:
        return CoordinatorClient(self.addresses, timeout_s=REQUEST_TIMEOUT_S)

    def _spawn(self, target: Callable[..., None], *args: Any) -> None:
        t = threading.Thread(target=target, args=args, daemon=True)
        t.start()
        self._threads.append(t)

    # -- the loops -------------------------------------------------------------------------------

    def _beat(self) -> None:
        client = self._client()
        try:
            while not self._stop.wait(self.heartbeat_s):
                self.send(client, [self._event("heartbeat", r) for r in self.ranks])
        finally:
            client.close()

    def _follow(self, rank: int) -> None:
        client = self._client()
        after = 0
        try:
            while not self._stop.is_set():
                try:
                    answer = client.updates(self.group, rank, after, POLL_TIMEOUT_S)
                except (CoordinatorUnavailable, CoordinatorError) as exc:
                    with self._lock:
                        self.failures.append(f"{time.monotonic():.3f} rank {rank}: {exc}")
                    self._stop.wait(RETRY_S)
                    continue
                for update in answer.updates:
                    if update["type"] == "view_prepare" and rank in update["participants"]:
                        ack = self._event("ack", rank, version=update["version"])
                        while not self.send(client, [ack]) and not self._stop.is_set():
                            self._stop.wait(RETRY_S)
                    elif update["type"] == "view_committed":
                        with self._lock:
                            self.committed[rank].append(update["version"])
                with self._lock:
                    self.resyncs += int(answer.resync)
                    self._lock.notify_all()
                after = answer.next_after
        finally:
            client.close()

    # -- waiting ---------------------------------------------------------------------------------

    def wait_version(self, version: int, timeout: float = 30.0) -> None:
        """Wait (woken by each long-poll answer) until every rank saw ``version`` committed."""
        with self._lock:
            ok = self._lock.wait_for(
                lambda: all(version in seen for seen in self.committed.values()), timeout
            )
        assert ok, f"not every rank saw view {version} within {timeout} s: {self.committed}"

    def acked_after(self, t: float) -> list[Acked]:
        with self._lock:
            return [a for a in self.acked if a.at > t]
