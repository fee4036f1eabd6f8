"""The worker side's facets: what the agent, the relay and the simulated hosts read of each
facet of foldplane that declares its part of the protocol in its folder (its ``protocol``
module: the updates its workers receive, the events they send).

The list of facets is the one both sides read (``wire.facets.BUILTIN_FACETS``); a facet without
a ``protocol`` module has no Structs of its own here. Only a facet's ``protocol`` module is
loaded, never its declaration or fold (the import contracts say so). A deployment's own facet
is followed by naming its Structs (``Agent.on_update``, ``Agent.send_event``); the relay, which
follows no Struct by name, reads the ``protocol`` modules of the facets ``FOLDPLANE_FACETS``
names too (:func:`updates_of`).

The readers are values built once, at import: nothing here changes after it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..wire.facets import BUILTIN_FACETS, protocols
from ..wire.protocol import PROTOCOL_READER, AgentEventBase, EventReader
from ..wire.updates import PROTOCOL_UPDATES, Update, UpdateReader

#: The variable that names a deployment's own facets, by package, comma-separated (the one the
#: coordinator's command line reads, ``coordinator/fold/registry.py``).
FACETS_ENV = "FOLDPLANE_FACETS"

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


def updates_of(packages: Iterable[str] | str | None) -> UpdateReader:
    """What a worker reads with a deployment's own facets, ``packages`` (a comma-separated
    string as ``FOLDPLANE_FACETS`` holds it, or the names): :data:`UPDATES` and the updates
    their ``protocol`` modules declare (``UPDATES``; a package without one adds none). A name
    that cannot be imported is an ImportError naming it."""
    if isinstance(packages, str) or packages is None:
        packages = (packages or "").split(",")
    named = dict.fromkeys(
        p.strip() for p in packages if p.strip() and p.strip() not in BUILTIN_FACETS
    )
    return UPDATES.with_types(*(u for m in protocols(named) for u in getattr(m, "UPDATES", ())))
