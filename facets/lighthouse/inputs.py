"""The lighthouse facet's inputs: one Struct per record kind, declared by their owners.

The rule's settings (``lighthouse_configured``) are :class:`~.effects.Settings`, a replica group's
quorum request (``lighthouse_request``) is torchft's member as the wire carries it
(:class:`~.messages.QuorumMember`); the heartbeats that arrived together, a launcher's report
of a lost replica group and a request withdrawn are declared here. The log stores each as its
payload; the fold (``fold.py``) decodes each input into its Struct (an input that does not
decode is refused, naming the field) and dispatches on the class. Pure: the agent may import it.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .effects import Settings
from .messages import QuorumMember

CONFIGURED = "lighthouse_configured"
REQUEST = "lighthouse_request"
HEARTBEAT = "lighthouse_heartbeat"
LOST = "lighthouse_lost"
WITHDRAWN = "lighthouse_withdrawn"

#: The longest reason a launcher may give for a lost replica group (encoded).
MAX_REASON_BYTES = 1024


class HeartbeatInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``lighthouse_heartbeat``: the replica groups whose beats arrived together."""

    replicas: list[str]


class LostInput(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """``lighthouse_lost``: a launcher saw the replica group ``replica`` die (every incarnation
    of that name is out), saying why."""

    replica: str
    reason: str


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
