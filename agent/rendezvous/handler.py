"""torch's ``RendezvousHandler`` on foldplane: each torchrun agent (a *node*) asks the
coordinator, and the coordinator's fold decides every round (``facets/rendezvous``).

What torchrun calls, and what this handler does for it:

- ``next_rendezvous()``: start a fresh ``TCPStore`` server on this node (a free port), send
  ``POST /rendezvous/{job}/join`` offering it, with why this node joins (its first call; its
  workers failed, the n-th restart; or nodes wait to be admitted) and the job's settings; then
  long-poll ``GET /rendezvous/{job}`` until a round names this node. Its rank is its place in
  the round; the round's store is rank 0's fresh server, so every round has a store of its own:
  neither this agent's rank assignment nor the workers' ``init_process_group`` (``MASTER_ADDR``
  / ``MASTER_PORT``, with ``TORCHELASTIC_USE_AGENT_STORE=True``) can read a key another round
  wrote, which is how torch's c10d backend sends restarted workers to a dead round's ports.
- ``num_nodes_waiting()`` (every monitor interval): what the fold says (rule 5 of the facet),
  from a background long poll, so it costs no request; a round formed without this node counts
  as a node waiting, so torchrun restarts and this node joins again.
- ``set_closed()`` / ``shutdown()`` (torchrun's run ended): ``POST /rendezvous/{job}/close``:
  the job ends for every node (torch's semantics). ``is_closed()`` reads it.
- a keep-alive thread: ``POST /rendezvous/{job}/keepalive`` every ``keep_alive_interval``.

Every call goes to the coordinator's addresses in turn (``agent.client``): after a leader's
death the next answer comes from the new leader, and a join sent again after a lost answer is
the same join (its ``attempt``). The first contact gives up after ``FOLDPLANE_START_TIMEOUT_S``
(10 s) naming each address; later ones keep trying until the join timeout. A refusal raises
torch's error with the coordinator's words: ``RendezvousClosedError`` for a closed job,
``RendezvousTimeoutError`` for a round that did not form in time, ``RendezvousError``
otherwise (a missing token, settings that differ from the job's).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)

from ...wire.codes import (
    FORBIDDEN,
    NODE_GONE,
    RENDEZVOUS_CLOSED,
    UNAUTHORIZED,
    UNKNOWN_RENDEZVOUS,
)
from ..client import CoordinatorClient, CoordinatorError, CoordinatorUnavailable
from .settings import RendezvousSettings

log = logging.getLogger("foldplane.rendezvous")

#: The backend's name: ``torchrun --rdzv-backend foldplane``.
BACKEND = "foldplane"
#: The longest one long poll waits (the server allows 60 s).
POLL_S = 25.0
#: How long to wait before asking again when no coordinator answers (a failover takes ~1 s).
RETRY_S = 0.2


class FoldplaneRendezvousHandler(RendezvousHandler):
    """One node's rendezvous (see the module docstring)."""

    def __init__(self, settings: RendezvousSettings) -> None:
        self.settings = settings
        self.node = f"{settings.store_host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._client = CoordinatorClient(
            list(settings.addresses), token=settings.token, timeout_s=10.0
        )
        self._lock = threading.Lock()
        #: the job as the coordinator last answered it
        self._status: dict[str, Any] | None = None
        #: the round this node is in (0: none yet), and whether a round was ever joined
        self._round = 0
        self._joins = 0
        #: torchrun's restart count as this node knows it: a join after its workers failed
        self._restarts = 0
        #: num_nodes_waiting() answered > 0 since the last join: the next join admits them
        self._told_waiting = False
        #: the round's store, while this node is its rank 0
        self._server: TCPStore | None = None
        self._stop = threading.Event()
        self._keepalive: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._closed_by_us = False

    # -- torch's interface -------------------------------------------------------------------

    def get_backend(self) -> str:
        return BACKEND

    def get_run_id(self) -> str:
        return self.settings.job

    @property
    def use_agent_store(self) -> bool:
        """The workers reach the round's store (rank 0's fresh server) as clients."""
        return True

    def next_rendezvous(self) -> RendezvousInfo:
        """Join the next round of the job and wait until it names this node (see the module
        docstring); raise torch's rendezvous errors with the coordinator's words."""
        s = self.settings
        if self._joins == 0:
            cause = "first"
        elif self._told_waiting:
            cause = "nodes_waiting"
        else:
            cause = "workers_failed"
            self._restarts += 1
        self._told_waiting = False
        first = self._joins == 0
        self._joins += 1
        server = TCPStore(
            s.store_host,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=timedelta(seconds=s.read_timeout_s),
        )
        attempt = uuid.uuid4().hex
        body = {
            "node": self.node,
            "attempt": attempt,
            "host": s.store_host,
            "store_port": int(server.port),
            "local_world_size": s.local_world_size,
            "cause": cause,
            "restart_count": self._restarts,
            **s.join_settings(),
        }
        deadline = time.monotonic() + (s.start_timeout_s if first else s.join_timeout_s)
        log.info(
            "node %s joins rendezvous %r at %s (%s)",
            self.node,
            s.job,
            ",".join(s.addresses),
            cause,
        )
        try:
            status = self._call("POST", f"/rendezvous/{s.job}/join", body, deadline)
            self._start_keepalive()
            round_, rank = self._wait_for_round(status, body, time.monotonic() + s.join_timeout_s)
        except BaseException as exc:
            if not isinstance(exc, RendezvousError):
                self._leave(f"its torchrun stopped while it waited ({type(exc).__name__})")
            raise
        nodes = round_["nodes"]
        store_host, store_port = nodes[0]["host"], int(nodes[0]["store_port"])
        if rank == 0:
            store: TCPStore = server
        else:
            store = self._connect(store_host, store_port)
        # this node hosts the round's store only as its rank 0; the store it hosted for the
        # round before goes (every worker of that round is gone: the agent stopped them)
        self._server = server if rank == 0 else None
        del server
        self._round = round_["round"]
        self._start_watcher()
        log.info(
            "node %s is rank %d of %d in round %d of rendezvous %r (store %s:%d)",
            self.node,
            rank,
            len(nodes),
            self._round,
            s.job,
            store_host,
            store_port,
        )
        return RendezvousInfo(store, rank, len(nodes), RendezvousStoreInfo(store_host, store_port))

    def is_closed(self) -> bool:
        status = self._status
        if status is None or status.get("closed") is None:
            try:
                status = self._get(timeout=0)
            except (CoordinatorError, CoordinatorUnavailable) as exc:
                log.warning(
                    "rendezvous %r: cannot ask whether it is closed: %s", self.settings.job, exc
                )
                return False
        return status.get("closed") is not None

    def set_closed(self) -> None:
        self._close(f"node {self.node}'s torchrun closed the rendezvous")

    def num_nodes_waiting(self) -> int:
        """The fold's answer (rule 5) as the watcher last read it; a round formed without this
        node counts as one node waiting, so torchrun restarts and this node joins again."""
        status = self._status
        if status is None:
            return 0
        waiting = int(status.get("nodes_waiting", 0))
        if status.get("round", 0) > self._round and self._round:
            waiting = max(waiting, 1)
        if waiting > 0:
            self._told_waiting = True
        return waiting

    def shutdown(self) -> bool:
        """torchrun's run ended: close the job (for every node, as torch's backends do) and
        stop this node's threads. False when the coordinator could not be told."""
        self._stop.set()
        try:
            self._close(f"node {self.node}'s torchrun shut down: its run ended")
            return True
        except RendezvousError as exc:
            log.warning("rendezvous %r: could not close it: %s", self.settings.job, exc)
            return False
        finally:
            self._client.close()

    # -- the round ------------------------------------------------------------------------------

    def _wait_for_round(
        self, status: dict[str, Any], body: dict[str, Any], deadline: float
    ) -> tuple[dict[str, Any], int]:
        """Long-poll until a round after this node's last one names it; its (status, rank)."""
        s = self.settings
        while True:
            self._status = status
            ranks = [n["node"] for n in status.get("nodes", [])]
            if status.get("closed"):
                raise RendezvousClosedError(_closed_words(s.job, status["closed"]))
            if status.get("round", 0) > self._round and self.node in ranks:
                return status, ranks.index(self.node)
            waiting = {w["node"] for w in status.get("waiting", [])}
            if self.node not in waiting:
                why = next(
                    (x["reason"] for x in status.get("left", []) if x["node"] == self.node), None
                )
                if why is not None and "timed_out" in why:
                    raise RendezvousTimeoutError(f"rendezvous {s.job!r}: node {self.node} {why}")
                if why is not None:
                    raise RendezvousError(f"rendezvous {s.job!r}: node {self.node} is out: {why}")
                # not waiting and never told why (a coordinator restored from an older copy):
                # the same join again
                status = self._call("POST", f"/rendezvous/{s.job}/join", body, deadline)
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                raise RendezvousTimeoutError(
                    f"rendezvous {s.job!r}: round {status.get('round', 0) + 1} did not form "
                    f"within {s.join_timeout_s:g} s; {len(waiting)} nodes waiting "
                    f"(min_nodes {s.min_nodes})"
                )
            status = self._call_get(status["version"], min(POLL_S, left), deadline)

    def _connect(self, host: str, port: int) -> TCPStore:
        try:
            return TCPStore(
                host,
                port,
                is_master=False,
                timeout=timedelta(seconds=self.settings.read_timeout_s),
            )
        except (RuntimeError, ValueError, TimeoutError) as exc:
            raise RendezvousConnectionError(
                f"rendezvous {self.settings.job!r}: cannot reach round {self._round + 1}'s store "
                f"at {host}:{port} (rank 0's): {exc}"
            ) from exc

    # -- requests -------------------------------------------------------------------------------

    def _request(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        """One request; after :meth:`shutdown` (its client closed) the rendezvous is over for
        this node: ``RendezvousClosedError``."""
        try:
            return self._client.request(method, path, **kw)
        except RuntimeError:
            if self._stop.is_set():
                raise RendezvousClosedError(
                    f"node {self.node}'s rendezvous handler was shut down"
                ) from None
            raise

    def _call(
        self, method: str, path: str, body: dict[str, Any] | None, deadline: float
    ) -> dict[str, Any]:
        """One request, tried until ``deadline`` while no coordinator answers (a failover);
        a refusal raises torch's error with the coordinator's words at once."""
        while True:
            try:
                return self._request(method, path, json=body)
            except CoordinatorError as exc:
                raise _refused(self.settings, exc) from None
            except CoordinatorUnavailable as exc:
                if time.monotonic() + RETRY_S >= deadline:
                    raise RendezvousConnectionError(
                        f"rendezvous {self.settings.job!r}: {exc}; check --rdzv-endpoint "
                        "(the coordinator's URLs)"
                    ) from None
                time.sleep(RETRY_S)

    def _call_get(self, after: int, timeout: float, deadline: float) -> dict[str, Any]:
        while True:
            try:
                return self._get(after=after, timeout=timeout)
            except CoordinatorError as exc:
                raise _refused(self.settings, exc) from None
            except CoordinatorUnavailable as exc:
                if time.monotonic() + RETRY_S >= deadline:
                    raise RendezvousConnectionError(
                        f"rendezvous {self.settings.job!r}: {exc}"
                    ) from None
                time.sleep(RETRY_S)

    def _get(self, *, after: int | None = None, timeout: float = 0) -> dict[str, Any]:
        params: dict[str, Any] = {"timeout": timeout}
        if after is not None:
            params["after"] = after
        return self._request(
            "GET", f"/rendezvous/{self.settings.job}", params=params, timeout_s=timeout + 10.0
        )

    def _leave(self, reason: str) -> None:
        """Best effort: the coordinator stops waiting for this node now, not at its timeout."""
        if self._stop.is_set():
            return  # shut down: the job is closed, nobody waits for this node
        try:
            self._client.request(
                "POST",
                f"/rendezvous/{self.settings.job}/leave",
                json={"node": self.node, "reason": reason},
            )
        except (CoordinatorError, CoordinatorUnavailable) as exc:
            log.info("rendezvous %r: leaving: %s", self.settings.job, exc)

    def _close(self, reason: str) -> None:
        if self._joins == 0:
            return  # this node never joined: there is nothing of it to close
        deadline = time.monotonic() + self.settings.close_timeout_s
        try:
            status = self._call(
                "POST",
                f"/rendezvous/{self.settings.job}/close",
                {"node": self.node, "reason": reason},
                deadline,
            )
        except RendezvousClosedError:
            return
        self._status = status
        self._closed_by_us = True

    # -- background threads ---------------------------------------------------------------------

    def _start_keepalive(self) -> None:
        if self._keepalive is None or not self._keepalive.is_alive():
            self._keepalive = threading.Thread(
                target=self._keep_alive, name="foldplane-rdzv-keepalive", daemon=True
            )
            self._keepalive.start()

    def _keep_alive(self) -> None:
        """A keep-alive every interval while this node is part of the job; a node the job lost
        stops (its next join brings it back), a closed job ends it."""
        s = self.settings
        told = False
        while not self._stop.wait(s.keepalive_interval_s):
            try:
                self._client.request(
                    "POST", f"/rendezvous/{s.job}/keepalive", json={"node": self.node}
                )
                told = False
            except CoordinatorError as exc:
                if exc.code in (RENDEZVOUS_CLOSED, NODE_GONE, UNKNOWN_RENDEZVOUS):
                    log.warning("rendezvous %r: keep-alives stop: %s", s.job, exc.detail)
                    return
                log.warning("rendezvous %r: keep-alive refused: %s", s.job, exc)
            except CoordinatorUnavailable as exc:
                if not told:
                    log.warning("rendezvous %r: keep-alive: %s (trying again)", s.job, exc)
                    told = True
            except Exception:  # the client closed under it at shutdown
                if self._stop.is_set():
                    return
                raise

    def _start_watcher(self) -> None:
        if self._watcher is None or not self._watcher.is_alive():
            self._watcher = threading.Thread(
                target=self._watch, name="foldplane-rdzv-watch", daemon=True
            )
            self._watcher.start()

    def _watch(self) -> None:
        """Keep :attr:`_status` fresh for ``num_nodes_waiting()``: a long poll at a time."""
        while not self._stop.is_set():
            status = self._status
            after = 0 if status is None else int(status.get("version", 0))
            try:
                fresh = self._get(after=after, timeout=POLL_S)
            except (CoordinatorError, CoordinatorUnavailable) as exc:
                log.debug("rendezvous %r: watching: %s", self.settings.job, exc)
                self._stop.wait(1.0)
                continue
            except Exception:  # the client closed under it at shutdown
                if self._stop.is_set():
                    return
                raise
            if fresh.get("version", 0) >= after:
                self._status = fresh
            if fresh.get("closed"):
                return


def _closed_words(job: str, closed: dict[str, Any]) -> str:
    return (
        f"rendezvous {job!r} was closed by node {closed.get('node')} ({closed.get('reason')}) "
        f"at offset {closed.get('offset')}; a new run takes a new --rdzv-id"
    )


def _refused(settings: RendezvousSettings, exc: CoordinatorError) -> RendezvousError:
    """torch's error for a coordinator's refusal, in its words."""
    if exc.code == RENDEZVOUS_CLOSED:
        return RendezvousClosedError(exc.detail)
    if exc.code in (UNAUTHORIZED, FORBIDDEN):
        return RendezvousError(
            f"the coordinator at {exc.url} refused rendezvous {settings.job!r}: {exc.status} "
            f"{exc.code}: {exc.detail}; give the coordinator's operator token as --rdzv-conf "
            "token=... or in FOLDPLANE_TOKEN"
        )
    return RendezvousError(f"rendezvous {settings.job!r}: {exc.status} {exc.code}: {exc.detail}")
