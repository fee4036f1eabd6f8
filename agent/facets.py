"""The worker side's facets: what the agent, the relay and the simulated hosts read of each
facet of foldplane that declares its part of the protocol in its folder (its ``protocol``
module: the updates its workers receive, the events they send), and the facets' worker parts
that the agent loads (the ``protocol`` module's ``WORKER``, a ``wire.facets.WorkerPart``).

The list of facets is the one both sides read (``wire.facets.BUILTIN_FACETS``), and, for the
agent's worker parts, a deployment's own in ``FOLDPLANE_FACETS`` (:func:`worker_parts`); a
facet without a ``protocol`` module has no Structs of its own here. Only a facet's ``protocol``
module is loaded, never its declaration or fold (the import contracts say so), and its worker
part only when the agent first needs it. A deployment's facet without a worker part is followed
by naming its Structs (``Agent.on_update``, ``Agent.send_event``); the relay, which follows no
Struct by name, reads the ``protocol`` modules of the facets ``FOLDPLANE_FACETS`` names too
(:func:`updates_of`).

The readers are values built once, at import: nothing here changes after it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from ..wire.facets import BUILTIN_FACETS, WorkerPart, protocols
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
#: What a worker reads: the protocol's own updates and the facets' (the agent's poller, the
#: relay, the simulated hosts).
UPDATES: UpdateReader = PROTOCOL_UPDATES.with_types(*FACET_UPDATES)
#: What a worker sends: the protocol's own events and the facets' (each by its ``type``).
EVENTS: EventReader = PROTOCOL_READER.with_types(*FACET_EVENTS)


@dataclass(frozen=True)
class WorkerSide:
    """What a facet's worker part is given of its agent: whom it speaks for, how it queues one
    of its facet's events (``send(kind, fields)``, fields without the envelope: the events lane
    sends it and its answer comes back to the part's ``on_answer``) and how it makes an
    operator's call (``request(method, path, json=...)``: ``POST /refits``, an epoch's plan)."""

    group: str
    rank: int
    send: Callable[[str, dict[str, Any]], None]
    request: Callable[..., Any]


class FacetWorker(Protocol):
    """A facet's worker part, one per agent, made by its module's ``WORKER(side)``: the agent's
    driver thread hands it the facet's updates (in offset order), the answers to the events it
    sent, and why the agent stopped (every wait of its callers ends then)."""

    def on_update(self, update: Any) -> None: ...

    def on_answer(
        self, kind: str, fields: dict[str, Any], offset: int | None, error: str | None, detail: str
    ) -> None: ...

    def on_stopped(self, why: str) -> None: ...


@dataclass(frozen=True)
class FacetWorkerPart:
    """A facet's worker part as the agent knows it before loading it: the facet's ``package``,
    its part's ``module``, the updates it follows, the event Structs it alone sends and the
    names it offers as the Agent's own (``wire.facets.WorkerPart``)."""

    package: str
    module: str
    updates: tuple[type[Update], ...]
    events: tuple[type[AgentEventBase], ...]
    offers: tuple[str, ...]

    @property
    def name(self) -> str:
        """The facet's short name: its package's last part (``refits``)."""
        return self.package.rsplit(".", 1)[-1]

    def make(self, side: WorkerSide) -> FacetWorker:
        """Load the part's module and make the part (its ``WORKER(side)``)."""
        return importlib.import_module(self.module).WORKER(side)  # type: ignore[no-any-return]


def worker_parts(packages: Iterable[str] = BUILTIN_FACETS) -> tuple[FacetWorkerPart, ...]:
    """The worker parts the ``protocol`` modules of ``packages`` declare, in their order
    (loads those modules only). Two parts that offer the same name are a ValueError."""
    found: list[FacetWorkerPart] = []
    offered: dict[str, str] = {}
    for module in protocols(packages):
        declared = getattr(module, "WORKER", None)
        if not isinstance(declared, WorkerPart):
            continue
        package = module.__name__.rsplit(".", 1)[0]
        for name in declared.offers:
            if name in offered:
                raise ValueError(f"{package} and {offered[name]} both offer the Agent's {name!r}")
            offered[name] = package
        found.append(
            FacetWorkerPart(
                package=package,
                module=f"{package}.{declared.module}",
                updates=tuple(getattr(module, "UPDATES", ())),
                events=tuple(getattr(module, "EVENTS", ())),
                offers=declared.offers,
            )
        )
    return tuple(found)


def deployment_facets(packages: Iterable[str] | str | None) -> tuple[str, ...]:
    """The packages of a deployment's own facets (a comma-separated string as
    ``FOLDPLANE_FACETS`` holds it, or the names), past the facets of foldplane, once each."""
    if isinstance(packages, str) or packages is None:
        packages = (packages or "").split(",")
    named = (p.strip() for p in packages)
    return tuple(dict.fromkeys(p for p in named if p and p not in BUILTIN_FACETS))


def updates_of(packages: Iterable[str] | str | None) -> UpdateReader:
    """What a worker reads with a deployment's own facets, ``packages`` (a comma-separated
    string as ``FOLDPLANE_FACETS`` holds it, or the names): :data:`UPDATES` and the updates
    their ``protocol`` modules declare (``UPDATES``; a package without one adds none). A name
    that cannot be imported is an ImportError naming it."""
    named = deployment_facets(packages)
    return UPDATES.with_types(*(u for m in protocols(named) for u in getattr(m, "UPDATES", ())))


#: The worker parts of the facets of foldplane.
WORKER_PARTS: tuple[FacetWorkerPart, ...] = worker_parts()
#: The facets' events whose answers go to a worker part, by kind: the facet's name. A caller of
#: ``Agent.send_event`` may not send them; every other facet's event is its caller's.
ANSWERED_BY: dict[str, str] = {
    e.__struct_config__.tag: part.name  # type: ignore[attr-defined]
    for part in WORKER_PARTS
    for e in part.events
}
