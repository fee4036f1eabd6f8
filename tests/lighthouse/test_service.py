"""``serve --lighthouse-port``: torchft's ``LighthouseService`` on a real coordinator process, spoken
to with raw gRPC calls carrying torchft's messages (torchft's own client and managers are in
test_torchft_client.py and test_torchft_contract.py).

- a quorum and a heartbeat answer, and the quorum is committed in the log: ``GET /lighthouse``,
  ``GET /lighthouse/quorums`` and ``replay`` (which derives the same rows again) agree;
- a launcher's death report takes a replica group out at once;
- hostile input on the gRPC port (malformed messages, absurd sizes, unknown methods, bytes that
  are not HTTP/2) gets a clear gRPC error and never takes the coordinator down, and nothing is
  written for it;
- the options are checked (min replicas required, bounds, a port in use) and the bind is
  loopback unless told.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest

from foldplane.facets.lighthouse import messages as m
from tests.conftest import free_port
from tests.service.conftest import ROOT, Server, make_server, replay


def lighthouse_server(tmp: Path, *options: str, env: dict[str, str] | None = None) -> Server:
    port = free_port()
    srv = make_server(
        tmp,
        args=["--lighthouse-port", str(port), "--lighthouse-min-replicas", "2", *options],
        env=env or {},
    )
    srv.lighthouse = port  # type: ignore[attr-defined]
    return srv


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Server]:
    srv = lighthouse_server(tmp_path, "--lighthouse-join-timeout-ms", "200").start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One coordinator that every malformed call of the module goes to."""
    srv = lighthouse_server(tmp_path_factory.mktemp("hostile")).start()
    yield srv
    srv.stop()


def channel(srv: Server) -> grpc.Channel:
    return grpc.insecure_channel(f"127.0.0.1:{srv.lighthouse}")  # type: ignore[attr-defined]


def call(ch: grpc.Channel, method: str, body: bytes, timeout: float = 10.0) -> bytes:
    return ch.unary_unary(method)(body, timeout=timeout)


def member(replica: str, step: int = 0, handles: tuple[str, ...] = ()) -> m.QuorumMember:
    return m.QuorumMember(
        replica_id=replica,
        address=f"http://{replica}:1",
        store_address=f"{replica}:2",
        step=step,
        world_size=len(handles) or 1,
        reconfigure_handles=handles,
    )


def ask_together(srv: Server, *members: m.QuorumMember) -> list[m.Quorum]:
    """Each member's quorum call on a thread of its own, as each replica group's manager."""
    out: dict[str, m.Quorum] = {}
    errors: list[BaseException] = []

    def one(mem: m.QuorumMember) -> None:
        try:
            with channel(srv) as ch:
                raw = call(ch, m.QUORUM_METHOD, m.encode_quorum_request(mem))
            out[mem.replica_id] = m.decode_quorum_response(raw)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(mem,)) for mem in members]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    return [out[mem.replica_id] for mem in members]


def test_a_quorum_is_decided_in_the_log_and_replays_identically(served: Server) -> None:
    a, b = member("a:1", 4, ("ha0", "ha1")), member("b:1", 7, ("hb0", "hb1"))
    qa, qb = ask_together(served, a, b)
    assert qa == qb
    assert qa.quorum_id == 1 and qa.participants == (a, b)  # replica-rank order, handles kept
    with channel(served) as ch:
        assert call(ch, m.HEARTBEAT_METHOD, m.encode_heartbeat_request("a:1")) == b""
    # the same members again: a fast quorum under the same id
    again = ask_together(served, member("a:1", 5, ("ha0", "ha1")), member("b:1", 8))
    assert {q.quorum_id for q in again} == {1}
    status = httpx.get(served.url + "/lighthouse").json()
    assert status["quorum_id"] == 1 and status["settings"]["min_replicas"] == 2
    assert status["last"]["replica_ids"] == ["a:1", "b:1"]
    assert set(status["heartbeats"]) == {"a:1", "b:1"}
    [row] = httpx.get(served.url + "/lighthouse/quorums").json()["quorums"]
    assert row["quorum_id"] == 1 and [p["step"] for p in row["participants"]] == [4, 7]
    assert [v["included"] for v in row["verdicts"]] == [True, True]
    assert served.stop() == 0
    result = replay(served.db, "--json")
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_launcher_death_report_takes_a_replica_group_out_at_once(served: Server) -> None:
    ask_together(served, member("a:1"), member("b:1"))
    lost = httpx.post(served.url + "/lighthouse/replicas/b/lost", json={"reason": "exit code -9"})
    assert lost.status_code == 201, lost.text
    # a asks alone: b is gone, so a is more than half of the healthy, and min_replicas is 2:
    # the rule waits for a second member, and says why
    with channel(served) as ch, pytest.raises(grpc.RpcError) as raised:
        call(ch, m.QUORUM_METHOD, m.encode_quorum_request(member("a:1", 1)), timeout=0.5)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    status = httpx.get(served.url + "/lighthouse").json()
    assert status["lost"] == {"b:1": lost.json()["offset"]}
    # the dead incarnation's calls are refused, naming the report
    with channel(served) as ch, pytest.raises(grpc.RpcError) as raised:
        call(ch, m.HEARTBEAT_METHOD, m.encode_heartbeat_request("b:1"))
    assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "reported lost at offset" in raised.value.details()
    # its replacement, under a new id, forms the next quorum with a
    qa, qc = ask_together(served, member("a:1", 2), member("b:2", 0))
    assert qa.quorum_id == 2 and [p.replica_id for p in qa.participants] == ["a:1", "b:2"]


def test_a_withdrawn_call_is_not_counted_on(served: Server) -> None:
    with channel(served) as ch, pytest.raises(grpc.RpcError) as raised:
        call(ch, m.QUORUM_METHOD, m.encode_quorum_request(member("a:1")), timeout=0.3)
    assert raised.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    deadline = httpx.get(served.url + "/lighthouse").json()
    for _ in range(100):
        if not deadline["requests"]:
            break
        deadline = httpx.get(served.url + "/lighthouse").json()
    assert deadline["requests"] == []


# -- hostile input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "body", "code", "says"),
    [
        (m.QUORUM_METHOD, b"", grpc.StatusCode.INVALID_ARGUMENT, "missing requester"),
        (m.QUORUM_METHOD, b"\x0a\x7f", grpc.StatusCode.INVALID_ARGUMENT, "bytes are left"),
        (m.QUORUM_METHOD, b"\x0a\x02\x0a\x00", grpc.StatusCode.INVALID_ARGUMENT, "replica_id"),
        (m.QUORUM_METHOD, b"\xff" * 12, grpc.StatusCode.INVALID_ARGUMENT, "varint"),
        (m.HEARTBEAT_METHOD, b"\x0a\x02\xc3\x28", grpc.StatusCode.INVALID_ARGUMENT, "UTF-8"),
        (m.HEARTBEAT_METHOD, b"\x10\x01", grpc.StatusCode.INVALID_ARGUMENT, "names its replica"),
        (
            m.QUORUM_METHOD,
            m.encode_quorum_request(member("a")) + b"\x0a" + b"\xff\xff\xff\xff\x07",
            grpc.StatusCode.INVALID_ARGUMENT,
            "bytes are left",
        ),
        ("/torchft.LighthouseService/Kill", b"", grpc.StatusCode.UNIMPLEMENTED, ""),
        ("/torchft.ManagerService/Quorum", b"", grpc.StatusCode.UNIMPLEMENTED, ""),
    ],
)
def test_a_malformed_call_gets_a_clear_error(
    hostile: Server, method: str, body: bytes, code: grpc.StatusCode, says: str
) -> None:
    with channel(hostile) as ch, pytest.raises(grpc.RpcError) as raised:
        call(ch, method, body)
    assert raised.value.code() == code, raised.value
    assert says in (raised.value.details() or "")
    assert httpx.get(hostile.url + "/lighthouse").json()["requests"] == []


def test_an_absurd_size_is_refused_before_it_is_read_and_the_service_goes_on(
    served: Server,
) -> None:
    huge = m.encode_quorum_request(member("a")) + b"\x7a" + b"\x80\x80\x40" + b"x" * (1 << 20)
    with channel(served) as ch:
        with pytest.raises(grpc.RpcError) as raised:
            call(ch, m.QUORUM_METHOD, huge)
        assert raised.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # a field within the message size but over its own bound
        data = m.QuorumMember(replica_id="a", data="x" * (m.MAX_DATA_BYTES + 1))
        with pytest.raises(grpc.RpcError) as raised:
            call(ch, m.QUORUM_METHOD, m.encode_quorum_request(data))
        assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "data has 65537 bytes" in raised.value.details()
    # garbage that is not HTTP/2 at all, and a connection cut mid-frame
    for junk in (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"\x00" * 4096, b"PRI * HTTP/2.0\r\n"):
        with socket.create_connection(("127.0.0.1", served.lighthouse), timeout=5) as s:  # type: ignore[attr-defined]
            s.sendall(junk)
    ask_together(served, member("a:1"), member("b:1"))  # still serving
    assert served.process is not None and served.process.poll() is None


def test_the_json_calls_refuse_a_malformed_body(hostile: Server) -> None:
    for path, body in (
        ("/lighthouse/quorum", {"member": {"replica_id": ""}, "timeout_s": 1}),
        ("/lighthouse/quorum", {"member": {"replica_id": "a"}, "timeout_s": 99999}),
        ("/lighthouse/heartbeats", {"replicas": []}),
        ("/lighthouse/replicas/a/lost", {"reason": ""}),
        ("/lighthouse/replicas/a/lost", {"why": "x"}),
    ):
        answer = httpx.post(hostile.url + path, json=body)
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["error"] == "invalid_request"


# -- options -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--lighthouse-port", "0"], "needs --lighthouse-min-replicas"),
        (["--lighthouse-port", "70000", "--lighthouse-min-replicas", "1"], "0 to 65535"),
        (["--lighthouse-port", "0", "--lighthouse-min-replicas", "0"], "min_replicas"),
        (
            [
                "--lighthouse-port",
                "0",
                "--lighthouse-min-replicas",
                "1",
                "--lighthouse-heartbeat-timeout-ms",
                "0",
            ],
            "heartbeat_timeout_ms",
        ),  # fmt: skip
    ],
)
def test_bad_lighthouse_options_are_refused(tmp_path: Path, options: list[str], says: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "serve", "--db", str(tmp_path / "l.db"),
         "--port", str(free_port()), "--store-port", "-1", *options],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2 and says in done.stderr, done.stderr


def test_a_lighthouse_port_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        srv = make_server(
            tmp_path, args=["--lighthouse-port", str(port), "--lighthouse-min-replicas", "1"]
        ).start(wait=False)
        assert srv.process is not None and srv.process.wait(60) == 2
    assert "--lighthouse-port: cannot bind" in srv.output()


def _listening(port: int) -> list[str]:
    """The local addresses that listen on ``port`` (``ss``: IPv4, IPv6, v4-mapped)."""
    out = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        local = line.split()[3]
        address, _, at = local.rpartition(":")
        if at == str(port):
            found.append(address.strip("[]").removeprefix("::ffff:"))
    return found


def test_the_lighthouse_binds_loopback_unless_told(served: Server, tmp_path: Path) -> None:
    assert _listening(served.lighthouse) == ["127.0.0.1"]  # type: ignore[attr-defined]
    (tmp_path / "any").mkdir()
    told = lighthouse_server(tmp_path / "any", "--lighthouse-host", "0.0.0.0").start()
    try:
        assert "its protocol carries no token" in told.output()
        # gRPC listens on every address, IPv4 and IPv6 (ss shows it as "*")
        assert _listening(told.lighthouse) in (["0.0.0.0"], ["*"])  # type: ignore[attr-defined]
    finally:
        told.stop()
