"""The worker side's facets: what the agent, the relay and the simulated hosts read of each
facet of foldplane that declares its part of the protocol in its folder (its ``protocol``
module: the updates its workers receive, the events they send).

The list of facets is the one both sides read (``wire.facets.BUILTIN_FACETS``); a facet without
a ``protocol`` module has no Structs of its own here. Only a facet's ``protocol`` module is
loaded, never its declaration or fold (the import contracts say so). A deployment's own facet
is followed by naming its Structs (``Agent.on_update``, ``Agent.send_event``).

The readers are values built once, at import: nothing here changes after it.
"""

from __future__ import annotations

from ..wire.facets import protocols
from ..wire.protocol import PROTOCOL_READER, AgentEventBase, EventReader
from ..wire.updates import PROTOCOL_UPDATES, Update, UpdateReader

_PROTOCOLS = protocols()
#: The updates of the facets' workers: each ``protocol`` module's ``UPDATES``.
FACET_UPDATES: tuple[type[Update], ...] = tuple(
    u for m in _PROTOCOLS for u in getattr(m, "UPDATES", ())
)
#: The events the facets' workers send: each ``protocol`` module's ``EVENTS``.
FACET_EVENTS: tuple[type[AgentEventBase], ...] = tuple(
    e for m in _PROTOCOLS for e in getattr(m, "EVENTS", ())
)
#: The facets' events whose answers go to a client of the agent, by kind: the attribute of
#: ``Agent`` a ``protocol`` module names as its ``ANSWERED_BY`` (the refit client's), which
#: alone sends them. Every other facet's event is ``Agent.send_event``'s.
ANSWERED_BY: dict[str, str] = {
    e.__struct_config__.tag: m.ANSWERED_BY  # type: ignore[attr-defined]
    for m in _PROTOCOLS
    if hasattr(m, "ANSWERED_BY")
    for e in getattr(m, "EVENTS", ())
}
#: What a worker reads: the protocol's own updates and the facets' (the agent's poller, the
#: relay, the simulated hosts).
UPDATES: UpdateReader = PROTOCOL_UPDATES.with_types(*FACET_UPDATES)
#: What a worker sends: the protocol's own events and the facets' (each by its ``type``).
EVENTS: EventReader = PROTOCOL_READER.with_types(*FACET_EVENTS)
