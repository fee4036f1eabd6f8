"""The lighthouse facet's inputs: one Struct per record kind, declared by their owners.

The rule's settings (``lighthouse_configured``) are :class:`~.effects.Settings`, a replica group's
quorum request (``lighthouse_request``) is torchft's member as the wire carries it
(:class:`~.messages.QuorumMember`); the heartbeats that arrived together, a launcher's report
of a lost replica group and a request withdrawn are declared here. The log stores each as its
payload; the fold (``fold.py``) decodes each input into its Struct (an input that does not
decode is refused, naming the field) and dispatches on the class. Pure: the agent may import it.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from ...wire.inputs import OnWire
from .effects import Settings
from .messages import MAX_ID_BYTES, QuorumMember

CONFIGURED = "lighthouse_configured"
REQUEST = "lighthouse_request"
HEARTBEAT = "lighthouse_heartbeat"
LOST = "lighthouse_lost"
WITHDRAWN = "lighthouse_withdrawn"

#: The longest reason a launcher may give for a lost replica group (encoded).
MAX_REASON_BYTES = 1024


#: What ``POST /lighthouse/heartbeats`` takes: replica group ids, each torchft's, at most 4096.
ReplicaIds = Annotated[
    list[Annotated[str, Meta(min_length=1, max_length=MAX_ID_BYTES)]],
    Meta(min_length=1, max_length=4096),
]


class HeartbeatInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``lighthouse_heartbeat``: the replica groups whose beats arrived together (the body of
    ``POST /lighthouse/heartbeats`` is made from it, ``models.py``, with the wire's bounds)."""

    replicas: Annotated[list[str], OnWire(ReplicaIds)]


class LostInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``lighthouse_lost``: a launcher saw the replica group ``replica`` die (every incarnation
    of that name is out), saying why (``POST /lighthouse/replicas/{replica}/lost``'s body is
    made from it, ``models.py``: the reason, as the wire bounds it)."""

    replica: str
    reason: Annotated[
        str, OnWire(Annotated[str, Meta(min_length=1, max_length=MAX_REASON_BYTES // 4)])
    ]


class WithdrawnInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``lighthouse_withdrawn``: the request at offset ``request`` of ``replica_id`` is withdrawn
    (its caller gave up waiting)."""

    replica_id: str
    request: int


#: The Struct of each of the facet's kinds.
INPUTS: dict[str, type[msgspec.Struct]] = {
    CONFIGURED: Settings,
    REQUEST: QuorumMember,
    HEARTBEAT: HeartbeatInput,
    LOST: LostInput,
    WITHDRAWN: WithdrawnInput,
}


def decode(kind: str, payload: Any) -> Any:
    """The typed input of a payload; ``msgspec.ValidationError`` names a field of the wrong type
    (the fold refuses such an input as ``invalid_event``)."""
    return msgspec.convert(payload, INPUTS[kind])
