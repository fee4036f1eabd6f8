"""An HTTP client for the coordinator's wire protocol (docs/protocol.md), over a list of addresses.

Several coordinators may serve one log, one leader at a time. The client keeps the address that
answered last and tries it first. A ``503 not_leader`` answer names the leader: the client goes
there at once, and the next call starts there too, even when the leader could not be reached in
this one (else each call would first wait out its timeout on the old, possibly frozen, leader). A connection failure moves on to the next address. When every address failed,
the call raises ``CoordinatorUnavailable`` naming each address and what went wrong; the caller
decides when to try again (the agent machine backs off; operator calls retry until a deadline).

An answer with an error body raises ``CoordinatorError`` carrying the HTTP status, the error
code and the coordinator's detail, so a refused request says exactly what was wrong.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from msgspec import to_builtins

from ..wire import life
from ..wire import ranks as rank_sets
from ..wire.codes import (
    BAD_ANSWER,
    HTTP_ERROR,
    NOT_FOLDPLANE,
    NOT_LEADER,
    TERMINAL,
    error_body,
)
from ..wire.protocol import FEATURES, PROTOCOL, AgentEventBase
from ..wire.updates import AgentUpdate, UpdateError, UpdateReader
from . import facets

#: How long one plain request may take; long polls add their own timeout on top.
DEFAULT_TIMEOUT_S = 10.0


#: How long :meth:`Agent.start` waits for the coordinator to answer and the group to exist
#: when neither ``start(timeout_s=...)`` nor ``FOLDPLANE_START_TIMEOUT_S`` says: a wrong
#: address or group name fails in seconds, with what was tried.
DEFAULT_START_TIMEOUT_S = 10.0
#: How often a waiting start says (once) what it is waiting for.
START_LOG_EVERY_S = 2.0


def start_timeout_s(timeout_s: float | None = None) -> float:
    """``timeout_s`` if given, else ``FOLDPLANE_START_TIMEOUT_S``, else the default."""
    if timeout_s is not None:
        return float(timeout_s)
    raw = os.environ.get("FOLDPLANE_START_TIMEOUT_S") or None
    if raw is None:
        return DEFAULT_START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"FOLDPLANE_START_TIMEOUT_S={raw!r} is not a positive number of seconds")
    return value


class CoordinatorError(Exception):
    """The coordinator answered with an error: ``status``, ``code`` and its ``detail``."""

    def __init__(self, status: int, code: str, detail: str, url: str) -> None:
        super().__init__(f"{status} {code}: {detail} ({url})")
        self.status = status
        self.code = code
        self.detail = detail
        self.url = url


class CoordinatorUnavailable(Exception):
    """No address answered; the message lists what happened at each one."""


@dataclass(frozen=True)
class UpdatesAnswer:
    """One answer of ``GET /agents/updates``."""

    updates: tuple[AgentUpdate, ...]
    next_after: int
    resync: bool
    store: tuple[str, int, str] | None
    term: int | None
    #: the coordinator's log is behind this reader: it was restored from an older copy
    restored: bool = False


def parse_addresses(addresses: str | Sequence[str]) -> list[str]:
    """``"http://a:1,http://b:2"`` or a list of URLs -> a list of base URLs without a final /."""
    items = addresses.split(",") if isinstance(addresses, str) else list(addresses)
    urls = [a.strip().rstrip("/") for a in items if a and a.strip()]
    if not urls:
        raise ValueError(f"no coordinator address in {addresses!r}")
    for url in urls:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"coordinator address {url!r} must start with http:// or https://")
    return urls


#: The coordinator addresses our clients talk to: httpx's INFO line per request is dropped
#: for these (a worker heartbeats and long-polls all the time; those lines are our noise, not
#: the user's), and kept for every other request the process makes.
_OURS: set[str] = set()


class _QuietOurRequests(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not isinstance(args, tuple) or len(args) < 2:
            return True
        url = str(args[1])
        return not any(url.startswith(base) for base in tuple(_OURS))


logging.getLogger("httpx").addFilter(_QuietOurRequests())


class CoordinatorClient:
    """Blocking calls to the coordinator. Thread-safe; one connection pool per client."""

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        token: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        self.addresses = parse_addresses(addresses)
        #: the updates :meth:`updates` reads: the protocol's, the facets' of foldplane
        #: (``agent/facets.py``) and those of the facets its agent follows
        self.reader: UpdateReader = facets.UPDATES
        _OURS.update(self.addresses)
        self._current = 0
        self._timeout_s = timeout_s
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(headers=headers, timeout=timeout_s)

    @property
    def address(self) -> str:
        """The address tried first: the last one that answered, or the leader last named."""
        return self.addresses[self._current]

    def close(self) -> None:
        self._http.close()

    # -- the agent wire protocol -----------------------------------------------------------------

    def post_events(
        self, events: Sequence[AgentEventBase | Mapping[str, Any]]
    ) -> list[dict[str, Any]]:
        """``POST /agents/events``: one result per event (a ``wire.protocol`` event, or its
        JSON object), ``{"offset"}`` or ``{"error", "detail"}``."""
        body = self.request("POST", "/agents/events", json={"events": to_builtins(events)})
        results = body.get("results")
        if not isinstance(results, list):
            raise CoordinatorError(200, BAD_ANSWER, f"no results list in {body!r}", self.address)
        return results

    def updates(
        self,
        group: str,
        rank: int | Sequence[int],
        after: int,
        timeout_s: float,
        *,
        view: int | None = None,
    ) -> UpdatesAnswer:
        """``GET /agents/updates``: a long poll for what concerns ``rank`` (one rank, or
        several ranks of one host) after ``after``; ``view``: the version held."""
        params: dict[str, Any] = {
            "group": group,
            "after": after,
            "timeout": timeout_s,
            "protocol": PROTOCOL,
            "features": ",".join(FEATURES),
        }
        if isinstance(rank, int):
            params["rank"] = rank
        else:
            params["ranks"] = rank_sets.format_query(rank)
        if view is not None:
            params["view"] = view
        body = self.request(
            "GET", "/agents/updates", params=params, timeout_s=timeout_s + self._timeout_s
        )
        store = body.get("store")
        try:
            updates = tuple(self.reader.decode_updates(body.get("updates") or ()))
        except UpdateError as exc:
            raise CoordinatorError(200, BAD_ANSWER, str(exc), self.address) from None
        return UpdatesAnswer(
            updates=updates,
            next_after=int(body.get("next_after") or after),
            resync=bool(body.get("resync", False)),
            restored=bool(body.get("restored", False)),
            store=(str(store["host"]), int(store["port"]), str(store.get("id", "")))
            if store
            else None,
            term=body.get("term"),
        )

    def report_death(
        self,
        group: str,
        rank: int,
        incarnation: str | None = None,
        reporter: str | None = None,
    ) -> dict[str, Any]:
        """``POST /agents/deaths``: the rank goes OFFLINE at once (a stale incarnation is 409).
        ``reporter`` says who saw it die and how, for the rank's story and the decision log."""
        body: dict[str, Any] = {"group": group, "rank": rank}
        if incarnation is not None:
            body["incarnation"] = incarnation
        if reporter is not None:
            body["reporter"] = reporter
        return self.request("POST", "/agents/deaths", json=body)

    # -- operator calls --------------------------------------------------------------------------

    def create_group(self, group: str, world_size: int, **config: Any) -> dict[str, Any]:
        """``POST /groups``; an identical group again is a no-op, another config a 409."""
        return self.request(
            "POST", "/groups", json={"group": group, "world_size": world_size, **config}
        )

    def group(self, group: str, *, timeout_s: float | None = None) -> dict[str, Any]:
        return self.request("GET", f"/groups/{group}", timeout_s=timeout_s)

    def groups(self, *, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """``GET /groups``: every group the coordinator holds, each with its state."""
        body = self.request("GET", "/groups", timeout_s=timeout_s)
        groups = body.get("groups")
        if not isinstance(groups, list):
            raise CoordinatorError(200, BAD_ANSWER, "no groups list in the answer", self.address)
        return groups

    def current_view(self, group: str) -> dict[str, Any]:
        return self.request("GET", "/views/current", params={"group": group})

    def view_history(self, group: str, after_version: int = 0) -> list[dict[str, Any]]:
        """Every committed view after ``after_version``, following the pages."""
        views: list[dict[str, Any]] = []
        cursor: int | None = after_version
        while cursor is not None:
            page = self.request(
                "GET",
                "/views/history",
                params={"group": group, "after_version": cursor, "limit": 1000},
            )
            views.extend(page.get("views", []))
            cursor = page.get("next_after_version")
        return views

    def propose(
        self,
        group: str,
        op: str,
        ranks: Sequence[int],
        *,
        proposer: str | None = None,
        idempotency_key: str | None = None,
        wait_s: float = 30.0,
        fields: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``POST /proposals`` and wait (up to ``wait_s``) for the terminal outcome.

        Returns the proposal as the coordinator answered it: terminal, or ``pending`` if
        ``wait_s`` passed first. The server waits at most 60 s per request, so longer waits
        poll ``GET /proposals/{id}``. ``fields``: the op's own (a reconfigure's ``uuid``,
        ``incarnations``, ``caller``, ``timeout_s``).
        """
        body: dict[str, Any] = {"group": group, "op": op, "ranks": list(ranks), **(fields or {})}
        if proposer is not None:
            body["proposer"] = proposer
        if idempotency_key is not None:
            body["idempotency_key"] = idempotency_key
        deadline = time.monotonic() + wait_s
        answer = self.request(
            "POST",
            "/proposals",
            params={"wait": min(wait_s, 60.0)},
            json=body,
            timeout_s=min(wait_s, 60.0) + self._timeout_s,
        )
        while answer.get("status") not in TERMINAL:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(0.05, left))
            answer = self.proposal(int(answer["id"]))
        return answer

    def proposal(self, proposal_id: int) -> dict[str, Any]:
        return self.request("GET", f"/proposals/{proposal_id}")

    def healthz(self) -> dict[str, Any]:
        return self.request("GET", "/healthz")

    # -- transport -------------------------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, Any] | None = None,
        json: Any = None,
        timeout_s: float | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """One call, tried at each address in turn, following ``not_leader`` to the leader.

        ``headers`` are added to (and override) the client's own, e.g. another ``authorization``.
        """
        failures: list[str] = []
        tried: set[str] = set()
        index = self._current
        while len(tried) < len(self.addresses):
            url = self.addresses[index]
            tried.add(url)
            try:
                response = self._http.request(
                    method,
                    url + path,
                    params=params,
                    json=json,
                    headers=headers,
                    timeout=self._timeout_s if timeout_s is None else timeout_s,
                )
            except httpx.HTTPError as exc:
                failures.append(f"{url}: {type(exc).__name__}: {exc}")
                index = (index + 1) % len(self.addresses)
                continue
            body = _json_body(response, url, f"{method} {path}")
            if body.get("error") == NOT_FOLDPLANE:
                raise CoordinatorError(response.status_code, NOT_FOLDPLANE, body["detail"], url)
            if response.status_code == 503 and body.get("error") == NOT_LEADER:
                failures.append(f"{url}: not the leader")
                leader = body.get("leader")
                if leader:
                    # The coordinators know better than our last success: the next call starts
                    # at the leader they name, even if it cannot be reached in this one.
                    index = self._current = self._index_of(str(leader))
                else:
                    index = (index + 1) % len(self.addresses)
                if self.addresses[index] in tried:
                    index = self._next_untried(tried, index)
                continue
            self._current = index
            if response.status_code >= 400:
                raise CoordinatorError(
                    response.status_code,
                    str(body.get("error", HTTP_ERROR)),
                    str(body.get("detail", response.text[:200])),
                    url,
                )
            return body
        raise CoordinatorUnavailable(
            f"{method} {path}: no coordinator answered: " + "; ".join(failures)
        )

    def _index_of(self, leader: str) -> int:
        leader = leader.rstrip("/")
        if leader not in self.addresses:
            self.addresses.append(leader)
            _OURS.add(leader)
        return self.addresses.index(leader)

    def _next_untried(self, tried: set[str], index: int) -> int:
        for step in range(len(self.addresses)):
            candidate = (index + step) % len(self.addresses)
            if self.addresses[candidate] not in tried:
                return candidate
        return index


def _json_body(response: httpx.Response, url: str, call: str) -> dict[str, Any]:
    """The answer's JSON object; an answer that is not JSON (another HTTP server's page) becomes
    a ``not_foldplane`` error that says what answered, never the page itself."""
    try:
        body = response.json()
    except ValueError:
        kind = response.headers.get("content-type", "no content type").split(";")[0]
        return error_body(
            NOT_FOLDPLANE,
            f"no foldplane coordinator at {url}: {call} answered HTTP "
            f"{response.status_code} with {kind} ({len(response.content)} bytes), not "
            "foldplane's JSON; check the address and port",
        )
    return body if isinstance(body, dict) else {"value": body}


def group_run(body: Mapping[str, Any]) -> tuple[str, str]:
    """Where a group's run stands, from its ``GET /groups/{group}`` document: ``(stage, text)``
    with stage ``forming`` (no view yet, still waiting for its ranks), ``running`` (formed,
    some rank online), or ``over`` (finished, ended, deleted, failed to form, shut down, or
    formed and no rank online any more: its ranks exited or died). ``text`` says it in the one
    vocabulary (``wire.life``): ``group 'train' finished; view 2; 4 ranks: 4 exited cleanly``."""
    text = f"group {body.get('group')!r} {life.run_text(body)}"
    status = body.get("status")
    if status == life.FORMING:
        return "forming", text
    online = int((body.get("rank_counts") or {}).get(life.ONLINE, 0))
    if status == life.RUNNING and online:
        return "running", text
    return "over", text
