"""``ReplicaExchange``: the rows a replica's processes swap each step, through the replica's own
``TCPStore`` (real stores on loopback, one thread per shard process)."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist

from foldplane.agent.fsdp import ReplicaExchange


def _open_all(shards: int, timeout_s: float = 10.0) -> list[ReplicaExchange]:
    """Every shard's exchange, opened concurrently as a replica's processes do (shard 0 hosts)."""
    rendezvous = dist.HashStore()
    got: dict[int, ReplicaExchange] = {}

    def open_one(shard: int) -> None:
        got[shard] = ReplicaExchange.open(rendezvous, "127.0.0.1", shard, shards, timeout_s)

    _in_threads([lambda s=s: open_one(s) for s in range(shards)])
    return [got[s] for s in range(shards)]


def _in_threads(calls: list[Callable[[], Any]]) -> list[Any]:
    results: list[Any] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except BaseException as exc:  # re-raised in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "an exchange never returned"
    if errors:
        raise errors[0]
    return results


def test_every_shard_gets_every_row_in_shard_order_round_after_round():
    exchanges = _open_all(3)
    for n in range(5):
        rows = [torch.tensor([n, s, -s, 10**12 + s], dtype=torch.int64) for s in range(3)]
        got = _in_threads(
            [lambda s=s, rows=rows: exchanges[s].all_gather(rows[s]) for s in range(3)]
        )
        expected = torch.cat(rows)
        for s in range(3):
            assert torch.equal(got[s], expected), (n, s)


def test_a_rounds_keys_are_deleted_once_every_shard_has_moved_past_it():
    exchanges = _open_all(2)
    for n in range(3):
        _in_threads(
            [lambda s=s, n=n: exchanges[s].all_gather(torch.tensor([n, s])) for s in range(2)]
        )
    # each shard's janitor thread deletes its keys off the caller's path
    assert all(e._janitor.wait_idle(10) for e in exchanges), "a janitor is still deleting"
    store = exchanges[0]._store
    stale = [f"fsdp-round/{n}/{s}" for n in range(2) for s in range(2)]
    assert not any(store.check([k]) for k in stale), "the keys of rounds 0 and 1 were kept"
    assert store.check(["fsdp-round/2/0"]) and store.check(["fsdp-round/2/1"])


def test_a_shard_that_never_comes_is_named():
    exchanges = _open_all(3, timeout_s=0.5)
    with pytest.raises(RuntimeError, match=r"round 0 .*shards \[2\] never came"):
        _in_threads([lambda s=s: exchanges[s].all_gather(torch.tensor([s])) for s in range(2)])


def test_a_dead_host_is_said_to_be_unreachable():
    exchanges = _open_all(2, timeout_s=0.5)
    host = exchanges.pop(0)
    host._store = None  # the hosting TCPStore's last reference: its server stops, as a
    del host  # dead shard 0's would
    gc.collect()
    unreachable = r"round 0 .*the replica's store \(shard 0's process\) is unreachable"
    with pytest.raises(RuntimeError, match=unreachable):
        exchanges[0].all_gather(torch.tensor([1]))


def test_closing_the_exchange_ends_its_janitor_thread():
    before = set(threading.enumerate())
    exchanges = _open_all(2)
    _in_threads([lambda s=s: exchanges[s].all_gather(torch.tensor([s])) for s in range(2)])
    started = [t for t in threading.enumerate() if t not in before]
    assert [t.name for t in started].count("foldplane-janitor") == 2
    assert all(e.close(10.0) for e in exchanges)
    assert [t.name for t in started if t.is_alive() and t.name == "foldplane-janitor"] == []
