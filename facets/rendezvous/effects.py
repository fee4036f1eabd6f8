"""The rendezvous facet's effects: what the fold decided about a torchrun job's rendezvous (the
glossary of the rest is ``coordinator/fold/effects.py``). Each names the job and carries the
fold's reason in words that name the nodes and rounds involved."""

from __future__ import annotations

import msgspec

from ...coordinator.fold.effects import Effect


class RoundNode(msgspec.Struct, frozen=True, kw_only=True):
    """One node of a formed round: its ``rank`` in the round (the agent's group rank), where its
    store listens (``host``, ``store_port``: rank 0's is the round's store), how many workers it
    runs (0: it did not say), and what it said when it joined (``cause``, ``restart_count``)."""

    node: str
    rank: int
    host: str
    store_port: int
    local_world_size: int
    cause: str
    restart_count: int


class NodeJoined(Effect, frozen=True, kw_only=True, tag="rdzv_node_joined"):
    """``node`` waits for round ``round`` of ``job``: it arrived (``cause`` ``first``) or its
    torchrun restarts (``workers_failed``, the ``restart_count``-th time; ``nodes_waiting``, to
    admit the nodes that wait). ``left_round``: the round it left by joining again (0: none).
    ``pending``: how many nodes wait now; ``reason``: the whole of it in words."""

    job: str
    node: str
    round: int
    cause: str
    restart_count: int
    left_round: int
    pending: int
    reason: str
    #: this node event's number in the job (1, 2, ...): its row's key
    seq: int
    offset: int


class RoundFormed(Effect, frozen=True, kw_only=True, tag="rdzv_round"):
    """Round ``round`` of ``job`` formed with ``nodes`` in rank order (rank 0 hosts its store:
    ``store_host``:``store_port``), ``world_size`` workers in all; ``reason`` says which rule
    formed it and who was left waiting or out. ``formed_ts``: the record's time."""

    job: str
    round: int
    nodes: tuple[RoundNode, ...]
    world_size: int
    store_host: str
    store_port: int
    reason: str
    spares: tuple[str, ...]
    formed_ts: int
    offset: int


class NodeLeft(Effect, frozen=True, kw_only=True, tag="rdzv_node_left"):
    """``node`` is no longer part of ``job``: it said so (``how`` ``left``), went silent past
    the keep-alive timeout (``lost``), or its round did not form within its join timeout
    (``timed_out``). ``round``: the round it was in or waited for; ``reason`` in words."""

    job: str
    node: str
    how: str
    round: int
    reason: str
    #: this node event's number in the job (1, 2, ...): its row's key
    seq: int
    offset: int


class JobClosed(Effect, frozen=True, kw_only=True, tag="rdzv_closed"):
    """``job``'s rendezvous is closed (by ``node``, for ``reason``): every node waiting is
    told so and every later join is refused. ``round``: its last round."""

    job: str
    node: str
    round: int
    reason: str
    offset: int


class JobCreated(Effect, frozen=True, kw_only=True, tag="rdzv_job"):
    """``job``'s first join fixed its settings (every later join must say the same)."""

    job: str
    node: str
    min_nodes: int
    max_nodes: int
    last_call_s: float
    join_timeout_s: float
    keepalive_timeout_s: float
    offset: int
