"""The facet registry: the one list of facets every layer reads.

A facet (``coordinator/fold/facets.py``) is one package that declares a :class:`FacetPlugin`
named ``PLUGIN`` in its ``__init__``. It is plugged in by one line: its package's name in
:data:`BUILTIN_FACETS` (a facet of foldplane) or in ``FOLDPLANE_FACETS`` (a comma-separated list
a deployment sets; the command line hands it to :func:`install`). Nothing else names it: the fold
builds its facet objects from the registry, the log accepts its record kinds, the journals and
readers decode its updates, ``POST /agents/events`` reads its agents' events, the projections
write its rows, the host carries out its effects and answers its resyncs, the API serves its
routes and the console its panel, ``replay`` compares its rows and retention knows which of its
kinds are heartbeat-class.

The plugin itself is pure (it names its fold object, its kinds and its rows); the parts that do
I/O are modules it names (``host``, ``routes``) and that only the layers allowed to do I/O
import (:func:`part`), so the fold stays pure and each layer imports only what lies below it.

The order of the facets is fixed (the built-in ones, then the installed ones in the order
given): their hooks run in it, so a replay decides exactly as the live fold did.
"""

from __future__ import annotations

import importlib
import importlib.resources
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...eventlog import ProjectionRow
from ...eventlog.record import MEMBERSHIP_KINDS, accept_kinds
from ...wire.protocol import AgentEventBase, declare_event
from ...wire.updates import Update, declare_update
from .effects import Effect
from .facets import Facet

#: The facets of foldplane, by package, in the order their hooks run.
BUILTIN_FACETS: tuple[str, ...] = (
    "foldplane.facets.epochs",
    "foldplane.facets.refits",
    "foldplane.facets.lighthouse",
    "foldplane.facets.rendezvous",
)

#: The environment variable that names a deployment's own facets (packages, comma-separated);
#: the command line reads it (``foldplane.cli``) and calls :func:`install`.
FACETS_ENV = "FOLDPLANE_FACETS"

#: An effect's projection rows.
RowsOf = Callable[[Any], list[ProjectionRow]]


@dataclass(frozen=True)
class FacetPlugin:
    """What a facet registers: everything the layers outside its fold read of it."""

    #: the facet's name: its snapshot key (``facets.<name>``), how the docs and the API name it
    name: str
    #: the record kinds it owns: the log accepts them, the fold hands them to the facet
    kinds: frozenset[str]
    #: a new fold object with no state (``coordinator.fold.facets.Facet``)
    fold: Callable[[], Facet]
    #: its effects' projection rows, by effect type (effects of no type here write none)
    rows: Mapping[type[Effect], RowsOf] = field(default_factory=dict)
    #: the Structs of its agent updates (``wire.updates.Update`` subclasses): every reader of
    #: this process decodes them (``wire.updates.declare_update``)
    updates: tuple[type[Update], ...] = ()
    #: the Structs of the agent events it takes (``wire.protocol.AgentEventBase`` subclasses,
    #: each ``type`` one of its ``kinds``): ``POST /agents/events`` reads them, and a worker
    #: sends one with ``Agent.send_event`` (``wire.protocol.declare_event``)
    events: tuple[type[AgentEventBase], ...] = ()
    #: the kinds of its projection rows, which ``replay`` compares like membership's
    projection_kinds: tuple[str, ...] = ()
    #: those of its kinds that are heartbeat-class: retention may remove one behind a kept
    #: snapshot when its step decided nothing (``coordinator.host.retention``)
    compactable: frozenset[str] = frozenset()
    #: by kind: the key that keeps an input of that kind out of a batch that holds another of
    #: the same key (``coordinator.host.inputs.batch_key``), from its payload, or None
    batch_key: Mapping[str, Callable[[dict[str, Any]], tuple[Any, ...] | None]] = field(
        default_factory=dict
    )
    #: the module of its host part: a ``HOST`` (``coordinator.host.facets.FacetHost``: what
    #: its effects ask of the host, and what a resync sends of it)
    host: str | None = None
    #: the module of its HTTP routes: a FastAPI ``router`` the API includes, and the bodies it
    #: adds to the OpenAPI document's components (``SCHEMA_TYPES``)
    routes: str | None = None
    #: the module of its panel in ``replay --plot``: a ``PANEL`` (``coordinator.plot.FacetPanel``)
    plot: str | None = None
    #: its panel in the operator's console: ``"package:file"``, an HTML fragment (its section,
    #: style and script; docs/console.md "A facet's panel") the console page includes
    console: str | None = None


_installed: tuple[str, ...] = ()
_loaded: dict[str, FacetPlugin] = {}
#: what :func:`plugins` and the tables read on every effect give, until the next install
_cache: dict[str, Any] = {}


def install(packages: Iterable[str] | str | None) -> None:
    """Plug in a deployment's facets (packages, or one comma-separated string), after the
    built-in ones. Replaces what was installed before; the packages are imported at once, so a
    wrong name fails here, naming it."""
    global _installed
    if isinstance(packages, str) or packages is None:
        packages = [p.strip() for p in (packages or "").split(",")]
    names = tuple(dict.fromkeys(p for p in packages if p and p not in BUILTIN_FACETS))
    for name in names:
        _load(name)
    _installed = names
    _cache.clear()


def installed() -> tuple[str, ...]:
    """The packages installed beside the built-in facets (:func:`install`)."""
    return _installed


def plugins() -> tuple[FacetPlugin, ...]:
    """Every facet, in the fixed order their hooks run."""
    out = _cache.get("plugins")
    if out is None:
        out = _cache["plugins"] = _plugins()
    return out


def _plugins() -> tuple[FacetPlugin, ...]:
    out = tuple(_load(name) for name in (*BUILTIN_FACETS, *_installed))
    seen: dict[str, str] = dict.fromkeys(MEMBERSHIP_KINDS, "membership")
    names: set[str] = set()
    for plugin in out:
        if plugin.name in names:
            raise ValueError(f"two facets are named {plugin.name!r}")
        names.add(plugin.name)
        for kind in plugin.kinds:
            if kind in seen:
                raise ValueError(
                    f"{seen[kind]!r} and facet {plugin.name!r} both declare record kind {kind!r}"
                )
            seen[kind] = plugin.name
    return out


def kinds() -> frozenset[str]:
    """Every record kind the facets own."""
    return frozenset().union(*(p.kinds for p in plugins()))


def all_kinds() -> frozenset[str]:
    """Every record kind the fold knows: membership's and the facets'."""
    return MEMBERSHIP_KINDS | kinds()


def rows_table() -> dict[type[Effect], RowsOf]:
    """Every facet's projection rows, by effect type."""
    table = _cache.get("rows")
    if table is None:
        table = _cache["rows"] = {t: f for p in plugins() for t, f in p.rows.items()}
    return table


def batch_keys() -> dict[str, Callable[[dict[str, Any]], tuple[Any, ...] | None]]:
    """Every facet's batch keys, by record kind."""
    table = _cache.get("batch_keys")
    if table is None:
        table = _cache["batch_keys"] = {k: f for p in plugins() for k, f in p.batch_key.items()}
    return table


def projection_kinds() -> tuple[str, ...]:
    """Every facet's projection kinds, in the facets' order."""
    return tuple(k for p in plugins() for k in p.projection_kinds)


def compactable() -> frozenset[str]:
    """The facets' heartbeat-class kinds (retention may remove them)."""
    out = _cache.get("compactable")
    if out is None:
        out = _cache["compactable"] = frozenset().union(*(p.compactable for p in plugins()))
    return out


def console_fragment(plugin: FacetPlugin) -> bytes | None:
    """The bytes of a plugin's console panel (None if it has none); a name that does not
    resolve fails naming it."""
    if plugin.console is None:
        return None
    package, _, name = plugin.console.partition(":")
    try:
        return importlib.resources.files(package).joinpath(name).read_bytes()
    except (ImportError, OSError) as exc:
        raise ValueError(
            f"facet {plugin.name!r}: its console panel {plugin.console!r} cannot be read: {exc}"
        ) from None


def part(plugin: FacetPlugin, which: str) -> Any:
    """The module of a plugin's ``host``, ``routes`` or ``plot`` part (None if it has none).
    Only the layer the part belongs to asks for it."""
    module = getattr(plugin, which)
    return None if module is None else importlib.import_module(module)


def _load(package: str) -> FacetPlugin:
    plugin = _loaded.get(package)
    if plugin is None:
        try:
            module = importlib.import_module(package)
        except ImportError as exc:
            raise ValueError(f"facet package {package!r} cannot be imported: {exc}") from None
        plugin = getattr(module, "PLUGIN", None)
        if not isinstance(plugin, FacetPlugin):
            raise ValueError(f"facet package {package!r} declares no PLUGIN (a FacetPlugin)")
        for event in plugin.events:
            kind = getattr(getattr(event, "__struct_config__", None), "tag", None)
            if kind not in plugin.kinds:
                raise ValueError(
                    f"facet {plugin.name!r} takes agent event {kind!r} ({event!r}), which is "
                    f"not one of its record kinds {sorted(plugin.kinds)}"
                )
        accept_kinds(plugin.kinds)
        for update in plugin.updates:
            declare_update(update)
        for event in plugin.events:
            declare_event(event)
        _loaded[package] = plugin
    return plugin
