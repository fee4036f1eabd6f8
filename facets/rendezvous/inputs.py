"""The rendezvous facet's inputs: one Struct per record kind, declared here, by their owner.

A node's torchrun agent (``agent/rendezvous.py``) calls the routes (``routes.py``), which build
these and submit them; the log stores each as its payload, and the fold (``fold.py``) decodes
every input it steps into its Struct and dispatches on the class. Each Struct's ``problem`` is its
``invalid_event`` rule: None for a well-formed payload (which then always decodes), or a message
naming the field. Pure: the agent may import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

import msgspec
from msgspec import Meta, Struct

from ...wire.inputs import OnWire

#: What a job's id (torchrun's ``--rdzv-id``) must match.
JOB_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
#: What a node's id and a store's host must match (a host name, an IPv4 or IPv6 address, a pid).
NODE_PATTERN = r"^[A-Za-z0-9_.:%\[\]-]{1,256}$"
HOST_PATTERN = r"^[A-Za-z0-9_.:%\[\]-]{1,255}$"
#: What a join's ``attempt`` must match (the handler sends a uuid's hex).
ATTEMPT_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
_JOB = re.compile(JOB_PATTERN)
_NODE = re.compile(NODE_PATTERN)
_HOST = re.compile(HOST_PATTERN)
_ATTEMPT = re.compile(ATTEMPT_PATTERN)

#: Why a node joins, as it says (``agent/rendezvous.py`` knows which).
CAUSES = ("first", "workers_failed", "nodes_waiting")
#: The most nodes one round may take (``max_nodes``).
MAX_NODES = 4096
#: The most workers one node may run (``--nproc-per-node``).
MAX_LOCAL_WORLD_SIZE = 65536
#: Bounds of the settings, in seconds.
MAX_LAST_CALL_S = 3600.0
MAX_JOIN_TIMEOUT_S = 7 * 86400.0
MAX_KEEPALIVE_TIMEOUT_S = 3600.0
#: The longest reason a node may give for leaving or closing.
MAX_REASON = 512
SETTINGS = ("min_nodes", "max_nodes", "last_call_s", "join_timeout_s", "keepalive_timeout_s")

# The bounds of the routes' bodies, which are made from the inputs (``models.py``: each field as
# the body bounds it, ``OnWire``); the fold refuses by the inputs' ``problem`` checks.
NodeId = Annotated[str, Meta(pattern=NODE_PATTERN, description="the node (a torchrun agent)")]
Reason = Annotated[str, Meta(min_length=1, max_length=MAX_REASON)]
Nodes = Annotated[int, Meta(ge=1, le=MAX_NODES)]

# -- the shapes ----------------------------------------------------------------------------


def _text(payload: dict[str, Any], name: str, pattern: re.Pattern[str], what: str) -> str | None:
    value = payload.get(name)
    if not isinstance(value, str) or not pattern.fullmatch(value):
        return f"{name} must be {what}, got {_shown(value)}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _integer(payload: dict[str, Any], name: str, lo: int, hi: int) -> str | None:
    value = payload.get(name)
    if type(value) is not int or not lo <= value <= hi:
        return f"{name} must be an integer from {lo} to {hi}, got {_shown(value)}"
    return None


def _seconds(payload: dict[str, Any], name: str, lo: float, hi: float, *, zero: bool) -> str | None:
    value = payload.get(name)
    ok = type(value) in (int, float) and (lo <= value if zero else lo < value) and value <= hi
    if not ok:
        bound = f"{'from' if zero else 'over'} {lo:g} {'to' if zero else 'up to'} {hi:g}"
        return f"{name} must be a number of seconds {bound}, got {_shown(value)}"
    return None


def join_problem(payload: Any) -> str | None:
    """What is wrong with an ``rdzv_join`` payload's shape, or None."""
    if not isinstance(payload, dict):
        return "the payload must be an object"
    checks = (
        _text(payload, "job", _JOB, f"a rendezvous id matching {JOB_PATTERN}"),
        _text(payload, "node", _NODE, f"a node id matching {NODE_PATTERN}"),
        _text(payload, "attempt", _ATTEMPT, f"an attempt id matching {ATTEMPT_PATTERN}"),
        _text(payload, "host", _HOST, f"the store's host matching {HOST_PATTERN}"),
        _integer(payload, "store_port", 1, 65535),
        _integer(payload, "local_world_size", 0, MAX_LOCAL_WORLD_SIZE),
        _integer(payload, "restart_count", 0, 2**31),
        _integer(payload, "min_nodes", 1, MAX_NODES),
        _integer(payload, "max_nodes", 1, MAX_NODES),
        _seconds(payload, "last_call_s", 0.0, MAX_LAST_CALL_S, zero=True),
        _seconds(payload, "join_timeout_s", 0.0, MAX_JOIN_TIMEOUT_S, zero=False),
        _seconds(payload, "keepalive_timeout_s", 0.0, MAX_KEEPALIVE_TIMEOUT_S, zero=False),
    )
    for problem in checks:
        if problem is not None:
            return problem
    if payload.get("cause") not in CAUSES:
        return f"cause must be one of {list(CAUSES)}, got {_shown(payload.get('cause'))}"
    if payload["max_nodes"] < payload["min_nodes"]:
        return (
            f"max_nodes {payload['max_nodes']} is below min_nodes {payload['min_nodes']} "
            "(torchrun's --nnodes MIN:MAX)"
        )
    return None


def node_problem(payload: Any, *, reason: bool) -> str | None:
    """What is wrong with a keep-alive's, a leave's or a close's payload, or None."""
    if not isinstance(payload, dict):
        return "the payload must be an object"
    for problem in (
        _text(payload, "job", _JOB, f"a rendezvous id matching {JOB_PATTERN}"),
        _text(payload, "node", _NODE, f"a node id matching {NODE_PATTERN}"),
    ):
        if problem is not None:
            return problem
    if reason:
        why = payload.get("reason")
        if not isinstance(why, str) or not 1 <= len(why) <= MAX_REASON:
            return f"reason must be text of 1 to {MAX_REASON} characters, got {_shown(why)}"
    return None


def _leave_problem(payload: Any) -> str | None:
    return node_problem(payload, reason=True)


def _keepalive_problem(payload: Any) -> str | None:
    return node_problem(payload, reason=False)


# -- the inputs --------------------------------------------------------------------------------


class RendezvousInput(Struct, frozen=True, kw_only=True, gc=False):
    """What every rendezvous input names: the job (torchrun's ``--rdzv-id``) and the node."""

    #: the record kind whose payload this is
    kind: ClassVar[str]
    #: the ``invalid_event`` rule: ``payload -> message | None``
    problem: ClassVar[Callable[[Any], str | None]]
    #: the route's path names it
    job: str
    node: Annotated[str, OnWire(NodeId)]


class JoinInput(RendezvousInput, frozen=True, kw_only=True, gc=False):
    """``rdzv_join``: ``node`` waits for the next round of ``job``, offering a fresh store at
    ``host``:``store_port``; the settings must be the job's (its first join fixes them)."""

    kind = "rdzv_join"
    problem = staticmethod(join_problem)
    attempt: Annotated[str, OnWire(Annotated[str, Meta(pattern=ATTEMPT_PATTERN)])]
    host: Annotated[str, OnWire(Annotated[str, Meta(pattern=HOST_PATTERN)])]
    store_port: Annotated[int, OnWire(Annotated[int, Meta(ge=1, le=65535)])]
    local_world_size: Annotated[int, OnWire(Annotated[int, Meta(ge=0, le=MAX_LOCAL_WORLD_SIZE)])]
    cause: Annotated[str, OnWire(Literal["first", "workers_failed", "nodes_waiting"])]
    restart_count: Annotated[int, OnWire(Annotated[int, Meta(ge=0, le=2**31)], default=0)]
    min_nodes: Annotated[int, OnWire(Nodes)]
    max_nodes: Annotated[int, OnWire(Nodes)]
    last_call_s: Annotated[int | float, OnWire(Annotated[float, Meta(ge=0, le=MAX_LAST_CALL_S)])]
    join_timeout_s: Annotated[
        int | float, OnWire(Annotated[float, Meta(gt=0, le=MAX_JOIN_TIMEOUT_S)])
    ]
    keepalive_timeout_s: Annotated[
        int | float, OnWire(Annotated[float, Meta(gt=0, le=MAX_KEEPALIVE_TIMEOUT_S)])
    ]


class KeepaliveInput(RendezvousInput, frozen=True, kw_only=True, gc=False):
    """``rdzv_keepalive``: ``node`` is alive."""

    kind = "rdzv_keepalive"
    problem = staticmethod(_keepalive_problem)


class LeaveInput(RendezvousInput, frozen=True, kw_only=True, gc=False):
    """``rdzv_leave``: ``node`` leaves the job, saying why."""

    kind = "rdzv_leave"
    problem = staticmethod(_leave_problem)
    reason: Annotated[str, OnWire(Reason)]


class CloseInput(RendezvousInput, frozen=True, kw_only=True, gc=False):
    """``rdzv_close``: ``node``'s torchrun closes the job for every node (its run ended)."""

    kind = "rdzv_close"
    problem = staticmethod(_leave_problem)
    reason: Annotated[str, OnWire(Reason)]


#: The Struct of each of the facet's kinds.
INPUTS: dict[str, type[RendezvousInput]] = {
    cls.kind: cls for cls in (JoinInput, KeepaliveInput, LeaveInput, CloseInput)
}


def decode(kind: str, payload: dict[str, Any]) -> RendezvousInput:
    """The typed input of a payload its Struct's ``problem`` accepted."""
    return msgspec.convert(payload, INPUTS[kind])
