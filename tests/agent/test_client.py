"""``CoordinatorClient`` against small real HTTP servers on 127.0.0.1: where it goes first."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from foldplane.agent.client import CoordinatorClient, CoordinatorUnavailable
from tests.conftest import free_port


class _Silent:
    """A frozen coordinator: accepts connections (the kernel's backlog does) and never answers.

    ``connections`` counts how many the client opened, so a test can say it was not tried.
    """

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.connections = 0
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._held.append(conn)

    def close(self) -> None:
        self.sock.close()
        for conn in self._held:
            conn.close()


def _serve(answer: tuple[int, dict[str, object]], port: int = 0) -> ThreadingHTTPServer:
    status, body = answer
    payload = json.dumps(body).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _url(server: ThreadingHTTPServer) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


@pytest.fixture
def silent() -> Iterator[_Silent]:
    frozen = _Silent()
    yield frozen
    frozen.close()


def test_a_named_leader_is_tried_first_on_the_next_call(silent: _Silent) -> None:
    """The old leader is frozen; a standby names the new one, which is not up yet. The next
    call goes to the named leader first and never waits on the frozen one again."""
    leader_port = free_port()
    leader_url = f"http://127.0.0.1:{leader_port}"
    standby = _serve((503, {"error": "not_leader", "detail": "standby", "leader": leader_url}))
    client = CoordinatorClient([silent.url, _url(standby)], timeout_s=0.5)
    try:
        with pytest.raises(CoordinatorUnavailable) as refused:
            client.healthz()
        message = str(refused.value)
        assert silent.url in message and "not the leader" in message and leader_url in message
        assert silent.connections == 1
        assert client.address == leader_url

        leader = _serve((200, {"status": "ok", "role": "leader"}), port=leader_port)
        try:
            assert client.healthz() == {"status": "ok", "role": "leader"}
            assert silent.connections == 1, "the frozen old leader was tried again"
            assert client.address == leader_url
        finally:
            leader.shutdown()
    finally:
        client.close()
        standby.shutdown()


def test_without_a_named_leader_the_last_answering_address_stays_first(silent: _Silent) -> None:
    """The twin: a ``not_leader`` that names nobody does not move the client's first choice."""
    standby = _serve((503, {"error": "not_leader", "detail": "no leader yet"}))
    client = CoordinatorClient([_url(standby), silent.url], timeout_s=0.5)
    try:
        with pytest.raises(CoordinatorUnavailable):
            client.healthz()
        assert silent.connections == 1
        assert client.address == _url(standby)
    finally:
        client.close()
        standby.shutdown()
