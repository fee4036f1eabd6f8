"""The relay itself: its HTTP server for the workers, its two events lanes, its updates lanes
and its upstream loop."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import msgspec

from ...wire.codes import (
    BODY_TOO_LARGE,
    COORDINATOR_UNAVAILABLE,
    INVALID_REQUEST,
    NESTING_TOO_DEEP,
    NOT_FOUND,
)
from ...wire.protocol import MAX_EVENTS, QUERY
from ..client import (
    CoordinatorClient,
    CoordinatorError,
    CoordinatorUnavailable,
)
from ..facets import FACETS_ENV, updates_of
from .cache import CACHE_BYTES
from .events import (
    MAX_BODY_BYTES,
    EventsLane,
)
from .lanes import (
    PollArgs,
    UpdatesLane,
)
from .replies import Counters, Reply, error, passed_on
from .upstream import Upstream

log = logging.getLogger("foldplane.relay")

#: How deep a worker's body may nest (the coordinator's default ``--max-json-depth``).
MAX_JSON_DEPTH = 32
#: The longest long poll a worker may ask for (the coordinator's limit).
MAX_POLL_S = QUERY.max_poll_s


def nesting(value: Any) -> int:
    """How deep ``value``'s arrays and objects nest (a scalar: 0)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = item.values()
        elif not isinstance(item, list):
            continue
        deepest = max(deepest, depth)
        stack.extend((child, depth + 1) for child in item)
    return deepest


def _upstream_error(exc: Exception) -> Reply:
    if isinstance(exc, CoordinatorError):
        return passed_on(exc.status, exc.code, exc.detail)
    return error(COORDINATOR_UNAVAILABLE, str(exc))


class Relay:
    """The relay's HTTP server, its lanes and its upstream loop; ``url`` is what the workers
    get as FOLDPLANE_RELAY.

    ``stats`` counts what it did: worker polls served by a lane (``polls_lane``) or forwarded
    on their own (``polls_solo``), lane channels opened (``lane_channels``), the most open at
    once (``lane_channels_max``) and the pushes they brought (``lane_pushes``); worker event
    requests (``events_requests``), upstream event batches (``events_upstream``, with
    ``events_sent`` events; ``events_merged`` of them carried several workers' requests) and
    the events channels opened for them (``events_channels``); the largest a lane's cache grew
    (``cache_bytes``) and the updates dropped to keep it within its bound before every rank had
    read them (``cache_dropped``).
    """

    def __init__(
        self,
        addresses: str | Sequence[str],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        timeout_s: float = 10.0,
        cache_bytes: int = CACHE_BYTES,
        facets: Iterable[str] | str | None = None,
    ) -> None:
        self.addresses = addresses
        #: the updates its lanes carry: the protocol's, the facets of foldplane's and those of
        #: a deployment's own facets (``facets``, packages; None: ``FOLDPLANE_FACETS``)
        self.updates = updates_of(os.environ.get(FACETS_ENV) if facets is None else facets)
        self.timeout_s = timeout_s
        self.cache_bytes = cache_bytes
        self.stats = Counters(
            "polls_lane",
            "polls_solo",
            "lane_channels",
            "lane_channels_max",
            "lane_pushes",
            "events_requests",
            "events_upstream",
            "events_sent",
            "events_merged",
            "events_channels",
            "cache_bytes",
            "cache_dropped",
        )
        self._lane_channels = 0  # open now
        self.upstream = Upstream(addresses, timeout_s, self.stats)
        self._solo_client = CoordinatorClient(addresses, timeout_s=timeout_s)
        #: the lanes that merge the workers' event requests: heartbeats, as the agent sends
        #: them, in a lane of their own, so a beat never waits behind a slow batch of events
        self.events = EventsLane(self.upstream, self.stats, "events")
        self.beats = EventsLane(self.upstream, self.stats, "beats")
        self._lanes: dict[tuple[str, str | None], UpdatesLane] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._started = False
        self._server = _Server((host, port), _Handler)
        self._server.relay = self
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="foldplane-relay", daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> Relay:
        self.upstream.start()
        self.events.start()
        self.beats.start()
        self._thread.start()
        self._started = True
        log.info("relay on %s for %s", self.url, self.addresses)
        return self

    def close(self) -> None:
        """Stop serving, close the channels (the batches in flight get ``503``); idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            lanes = list(self._lanes.values())
        if self._started:
            self._server.shutdown()
        self._server.server_close()
        for lane in lanes:
            lane.close()
        self.upstream.close()
        self.events.close()
        self.beats.close()
        self._solo_client.close()

    def __enter__(self) -> Relay:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def lane(self, group: str, protocol: str | None) -> UpdatesLane | None:
        with self._lock:
            if self._closed:
                return None
            lane = self._lanes.get((group, protocol))
            if lane is None:
                lane = self._lanes[(group, protocol)] = UpdatesLane(
                    group, protocol, self, self.cache_bytes
                )
            return lane

    def lane_channel(self, delta: int) -> None:
        """A lane's channel opened (+1) or ended (-1)."""
        with self._lock:
            self._lane_channels += delta
            if delta > 0:
                self.stats.add("lane_channels")
                self.stats.peak("lane_channels_max", self._lane_channels)

    # -- what the handler calls ------------------------------------------------------------------

    def post_events(self, body: Any, token: str | None, nbytes: int) -> Reply:
        events = body.get("events") if isinstance(body, dict) else None
        if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
            return error(INVALID_REQUEST, 'the body must be {"events": [objects]}')
        if len(events) > MAX_EVENTS:
            return error(INVALID_REQUEST, f"{len(events)} events; at most {MAX_EVENTS}")
        if not events:
            return 200, {"term": None, "results": []}
        if nesting(body) > MAX_JSON_DEPTH:
            # what the coordinator answers such a body (its channel cannot say which batch)
            return error(
                NESTING_TOO_DEEP,
                f"the body nests arrays and objects more than {MAX_JSON_DEPTH} levels deep, "
                "the limit (--max-json-depth)",
            )
        beats = all(e.get("type") == "heartbeat" for e in events)
        return (self.beats if beats else self.events).submit(events, token, nbytes)

    def get_updates(self, query: Mapping[str, list[str]], token: str | None) -> Reply:
        args = _poll_args(query)
        if isinstance(args, str):
            return error(INVALID_REQUEST, args)
        if args is None:  # not the one-rank form: the coordinator answers it
            params = {k: v[-1] for k, v in query.items()}
            return self.forward_poll(params, token)
        lane = self.lane(args.group, args.protocol)
        if lane is None:
            return error(COORDINATOR_UNAVAILABLE, "the relay is shutting down")
        return lane.poll(args, token)

    def forward_poll(self, params: Mapping[str, Any], token: str | None) -> Reply:
        """One worker's poll, upstream over HTTP as it came (with its own token)."""
        headers = {"authorization": f"Bearer {token}"} if token else None
        try:
            timeout = min(float(params.get("timeout", QUERY.poll_timeout_s)), MAX_POLL_S)
        except (TypeError, ValueError):
            timeout = MAX_POLL_S
        try:
            return 200, self._solo_client.request(
                "GET",
                "/agents/updates",
                params=params,
                headers=headers,
                timeout_s=timeout + self.timeout_s,
            )
        except (CoordinatorError, CoordinatorUnavailable, RuntimeError) as exc:
            return _upstream_error(exc)


def _poll_args(query: Mapping[str, list[str]]) -> PollArgs | str | None:
    """The one-rank poll a query asks for, None for another form, or what is wrong with it."""
    one = {k: v[-1] for k, v in query.items()}
    if "ranks" in one or "rank" not in one or "group" not in one:
        return None
    try:
        rank = int(one["rank"])
        after = int(one.get("after", 0))
        timeout = float(one.get("timeout", QUERY.poll_timeout_s))
    except ValueError as exc:
        return f"rank, after and timeout must be numbers: {exc}"
    if rank < 0 or after < 0 or not timeout >= 0:
        return "rank, after and timeout must not be negative"
    return PollArgs(
        one["group"],
        rank,
        after,
        min(timeout, MAX_POLL_S),
        one.get("protocol"),
        one.get("view"),
        one.get("features"),
    )


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    relay: Relay

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a worker that died mid-request (the launcher reports it): not the relay's failure
        log.debug("relay: a request from %s ended early", client_address, exc_info=True)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server
    #: TCP_NODELAY on every worker connection. With Nagle's algorithm on, a reply's second
    #: segment waits for the worker to acknowledge the first, and the worker's TCP delays that
    #: acknowledgement by up to 40 ms: every update a worker receives would come that much late.
    disable_nagle_algorithm = True
    #: an idle worker connection is closed after this many seconds
    timeout = 2 * MAX_POLL_S

    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path != "/agents/updates":
            self._reply(error(NOT_FOUND, f"the relay serves no GET {url.path}"))
            return
        self._reply(self.server.relay.get_updates(parse_qs(url.query), self._token()))

    def do_POST(self) -> None:
        url = urlsplit(self.path)
        length = int(self.headers.get("content-length") or 0)
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            self._reply(error(BODY_TOO_LARGE, f"{length} bytes; at most {MAX_BODY_BYTES}"))
            return
        raw = self.rfile.read(length)
        if url.path != "/agents/events":
            self._reply(error(NOT_FOUND, f"the relay serves no POST {url.path}"))
            return
        try:
            body = json.loads(raw)
        except ValueError as exc:
            self._reply(error(INVALID_REQUEST, f"the body is not JSON: {exc}"))
            return
        self._reply(self.server.relay.post_events(body, self._token(), length))

    def _token(self) -> str | None:
        scheme, _, token = (self.headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return None
        return token.strip()

    def _reply(self, reply: Reply) -> None:
        status, body = reply
        data = msgspec.json.encode(body)  # its updates are Structs
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        if self.close_connection:
            # said, not only done: a client that reads no "close" sends its next request on
            # this connection and finds it shut
            self.send_header("connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("relay: " + format, *args)
