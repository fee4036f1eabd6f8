"""foldplane's torchrun rendezvous handler (agent/rendezvous/) against a real coordinator
process, driven the way torchrun's agent drives it, in threads of this process: registered by
the entry point, rounds with a fresh store each (no key of one round in the next), a restart
seen by the other node as a node waiting, the token it needs, the closing, a wrong address and
a command line it cannot run. Real torchrun runs it in tests/agent/test_torchrun.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.api import (
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
)

from foldplane.agent.rendezvous import create_handler
from foldplane.agent.rendezvous.settings import SettingsError, settings_from
from tests.conftest import free_port
from tests.service.conftest import Server, make_server

TOKEN = "rdzv-token"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One coordinator for the module; each test's job has a name of its own."""
    tmp = tmp_path_factory.mktemp("rdzv")
    srv = make_server(tmp, env={"FOLDPLANE_TOKEN": TOKEN, "FOLDPLANE_SECRET": ""}).start()
    yield srv
    srv.stop()


def params(url: str, job: str = "job", nnodes: tuple[int, int] = (1, 2), **conf: Any) -> Any:
    conf = {"token": TOKEN, "last_call_timeout": "0.3", "local_world_size": "2", **conf}
    return RendezvousParameters(
        "foldplane", url, job, nnodes[0], nnodes[1], local_addr="127.0.0.1", **conf
    )


def in_thread(fn: Any) -> tuple[threading.Thread, dict[str, Any]]:
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def result(t: threading.Thread, out: dict[str, Any], timeout: float = 60) -> Any:
    t.join(timeout)
    assert not t.is_alive(), "the call did not return in time"
    if "error" in out:
        raise out["error"]
    return out["value"]


def test_torchrun_finds_the_backend_through_its_entry_point() -> None:
    from torch.distributed.elastic.rendezvous import registry

    handler = registry.get_rendezvous_handler(params("http://127.0.0.1:1"))
    assert handler.get_backend() == "foldplane" and handler.get_run_id() == "job"
    assert handler.use_agent_store is True


def test_two_nodes_form_rounds_each_with_a_fresh_store_and_a_restart_is_seen(
    server: Server,
) -> None:
    a, b = create_handler(params(server.url, "two")), create_handler(params(server.url, "two"))
    ta, oa = in_thread(a.next_rendezvous)
    tb, ob = in_thread(b.next_rendezvous)
    ia, ib = result(ta, oa), result(tb, ob)
    assert sorted([ia.rank, ib.rank]) == [0, 1] and ia.world_size == ib.world_size == 2
    info0 = ia if ia.rank == 0 else ib
    assert ia.bootstrap_store_info.master_port == ib.bootstrap_store_info.master_port
    # the agents share the round's store: what one sets, the other reads
    ia.store.set("torchelastic/role_info/0", b"a")
    assert ib.store.get("torchelastic/role_info/0") == b"a"
    assert a.num_nodes_waiting() == b.num_nodes_waiting() == 0

    # b's workers fail: it joins again; a hears of it as a node waiting, and joins too
    tb, ob = in_thread(b.next_rendezvous)
    # torchrun's monitor asks num_nodes_waiting() at an interval: this is that monitor, faster
    # (bounded at 30 s). It reads the status a's watcher thread keeps by long poll, which
    # offers no event to wait on: a wait on the coordinator's own long poll would race it.
    deadline = time.monotonic() + 30
    while a.num_nodes_waiting() == 0:
        assert time.monotonic() < deadline, "a never saw b waiting"
        time.sleep(0.05)
    ta, oa = in_thread(a.next_rendezvous)
    ja, jb = result(ta, oa), result(tb, ob)
    port = ja.bootstrap_store_info.master_port
    assert port == jb.bootstrap_store_info.master_port
    assert port != info0.bootstrap_store_info.master_port  # a store of its own
    assert not ja.store.check(["torchelastic/role_info/0"])  # round 1's key is not there
    assert ja.rank == ia.rank  # the members keep their order

    status = a._get()
    assert status["round"] == 2 and status["nodes_waiting"] == 0
    causes = sorted(n["cause"] for n in status["nodes"])
    assert causes == ["nodes_waiting", "workers_failed"]
    assert [n["restart_count"] for n in status["nodes"] if n["cause"] == "workers_failed"] == [1]

    # torchrun's run ended on a: the job is closed for every node
    assert a.shutdown() is True
    assert b.is_closed() is True
    late = create_handler(params(server.url, "two"))
    with pytest.raises(RendezvousClosedError, match="new --rdzv-id"):
        late.next_rendezvous()
    assert b.shutdown() is True  # closing a closed job is no error


def test_without_the_token_the_coordinator_refuses_it_clearly(server: Server) -> None:
    handler = create_handler(params(server.url, "token", token=""))
    with pytest.raises(RendezvousError, match="401 unauthorized.*--rdzv-conf token="):
        handler.next_rendezvous()
    wrong = create_handler(params(server.url, "token", token="not-the-token"))
    with pytest.raises(RendezvousError, match="403 forbidden"):
        wrong.next_rendezvous()


def test_settings_that_differ_from_the_jobs_are_refused_naming_them(server: Server) -> None:
    first = create_handler(params(server.url, job="conf", nnodes=(2, 2)))
    t, out = in_thread(first.next_rendezvous)
    # Its join landed (the job has its settings) when the handler holds the coordinator's
    # answer. The handler offers no event for it, and the coordinator's long poll cannot wait
    # for a job that does not exist yet (404): watched, bounded at 30 s and by the thread.
    deadline = time.monotonic() + 30
    while first._status is None:
        assert time.monotonic() < deadline and t.is_alive(), out
        time.sleep(0.02)
    other = create_handler(params(server.url, job="conf", nnodes=(1, 2)))
    with pytest.raises(RendezvousError, match=r"min_nodes 1 \(the rendezvous has 2\)"):
        other.next_rendezvous()
    first.shutdown()
    with pytest.raises(RendezvousClosedError):
        result(t, out)


def test_a_wrong_address_fails_within_the_start_timeout_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FOLDPLANE_START_TIMEOUT_S", "1")
    url = f"http://127.0.0.1:{free_port()}"
    handler = create_handler(params(url))
    started = time.monotonic()
    with pytest.raises(RendezvousConnectionError, match=url.replace(".", r"\.")):
        handler.next_rendezvous()
    assert time.monotonic() - started < 10


@pytest.mark.parametrize(
    ("endpoint", "job", "conf", "words"),
    [
        ("", "job", {}, "--rdzv-endpoint is required"),
        ("ftp://x:1", "job", {}, "must start with http"),
        ("http://x:1", "bad id", {}, "--rdzv-id 'bad id' is not a foldplane rendezvous id"),
        ("http://x:1", "job", {"is_host": "1"}, "--rdzv-conf is_host: not a key"),
        ("http://x:1", "job", {"join_timeout": "soon"}, "join_timeout=soon"),
        ("http://x:1", "job", {"keep_alive_max_attempt": "0.5"}, "a whole number"),
        ("http://x:1", "job", {"local_world_size": "0"}, "local_world_size=0"),
    ],
)
def test_a_command_line_it_cannot_run_is_refused_saying_what_to_change(
    endpoint: str, job: str, conf: dict[str, str], words: str
) -> None:
    p = RendezvousParameters("foldplane", endpoint, job, 1, 2, **conf)
    with pytest.raises(SettingsError, match=words.replace("(", r"\(").replace(")", r"\)")):
        settings_from(p)


def test_the_settings_read_torchruns_names_and_its_command_line() -> None:
    p = RendezvousParameters(
        "foldplane",
        "c1:8470, http://c2:8470",
        "job",
        1,
        4,
        local_addr="10.0.0.5",
        timeout=900,  # torchrun's launcher always adds it
        keep_alive_interval="2",
        keep_alive_max_attempt="3",
    )
    s = settings_from(p, env={"FOLDPLANE_TOKEN": "t"}, argv=["torchrun", "--nproc_per_node=4"])
    assert s.addresses == ("http://c1:8470", "http://c2:8470")
    assert (s.token, s.store_host, s.local_world_size) == ("t", "10.0.0.5", 4)
    assert s.keepalive_timeout_s == 6.0 and s.last_call_s == 30.0 and s.join_timeout_s == 600.0
    assert settings_from(p, env={}, argv=["torchrun", "--nproc-per-node", "gpu"]).token is None
    assert (
        settings_from(p, env={}, argv=["torchrun", "--nproc-per-node", "gpu"]).local_world_size == 0
    )
