"""The facet registry: the one list of facets every layer reads.

A facet (``coordinator/fold/facets.py``) is one package that declares a :class:`FacetPlugin`
named ``PLUGIN`` in its ``__init__``. It is plugged in by one line: its package's name in
:data:`BUILTIN_FACETS` (``wire/facets.py``, the one list both sides read: a facet of
foldplane) or in ``FOLDPLANE_FACETS`` (a comma-separated list a deployment sets; the command
line hands it to :func:`install`). Nothing else names it.

A list of facets becomes a :class:`Facets`, a value that holds every table of them: whoever
composes the facets builds one and hands it on, so loading a facet changes nothing outside the
value (two hosts with different facets live in one process). Through it the fold builds its
facet objects, the log accepts their record kinds, the journals and readers decode their
updates, ``POST /agents/events`` reads its agents' events, the projections
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
from ...eventlog.record import MEMBERSHIP_KINDS, check_kinds
from ...wire.facets import BUILTIN_FACETS  # re-exported: the registry's list of them
from ...wire.protocol import PROTOCOL_READER, AgentEventBase, EventReader
from ...wire.updates import PROTOCOL_UPDATES, Update, UpdateReader
from .effects import Effect
from .facets import Facet

#: The environment variable that names a deployment's own facets (packages, comma-separated);
#: the command line reads it (``foldplane.cli``) and calls :func:`install`.
FACETS_ENV = "FOLDPLANE_FACETS"

#: An effect's projection rows.
RowsOf = Callable[[Any], list[ProjectionRow]]


@dataclass(frozen=True)
class Explain:
    """A facet's story in ``explain``: the option that names whose (``option`` and its
    ``metavar``, with its ``help``), beside a rank's ``--group G --rank R``, and what tells it,
    each ``"module:function"``, imported when asked for: ``tell(target, key, *, until)``, a
    coroutine giving the story (a ``coordinator.host.story.StoryError`` when the log holds
    none), and ``shown(story)``, the story as ``format_story`` prints it (None: as it is)."""

    option: str
    metavar: str
    help: str
    tell: str
    shown: str | None = None

    def function(self, which: str) -> Callable[..., Any] | None:
        """The function ``tell`` or ``shown`` names, imported (None if it names none)."""
        name = getattr(self, which)
        if name is None:
            return None
        module, _, attr = name.partition(":")
        return getattr(importlib.import_module(module), attr)


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
    #: the Structs of its agent updates (``wire.updates.Update`` subclasses): the readers of
    #: a composition that holds it decode them (:attr:`Facets.updates`)
    updates: tuple[type[Update], ...] = ()
    #: the Structs of the agent events it takes (``wire.protocol.AgentEventBase`` subclasses,
    #: each ``type`` one of its ``kinds``): ``POST /agents/events`` of a host that holds it
    #: reads them (:attr:`Facets.events`), and a worker sends one with ``Agent.send_event``
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
    #: its story in ``explain`` (``cli.py``): the option that names whose, and what tells it
    explain: Explain | None = None
    #: the module of its part of ``serve`` (``cli.py``), for a facet that serves beside the
    #: HTTP server: ``options(parser)`` adds its option group (after ``serve``'s own, in the
    #: facets' order), ``check(args)`` says what is wrong with them once parsed (None: nothing;
    #: ``serve`` prints it and exits with 2 before it opens the log), and the coroutine
    #: ``start(args, host, auth)`` starts what its options ask for on the opened host: None
    #: (nothing asked), or what ``serve`` closes (``await served.close()``) at shutdown, before
    #: the host; an OSError it raises is printed and ``serve`` exits with 2. The module is
    #: imported when ``serve``'s parser is built, so it imports what it serves only in ``start``
    serve: str | None = None
    #: the module of its part of the simulator (``sim/world.py``, "Facets"): ``draw(seed,
    #: ranks, horizon)``, what a seed draws for it and the faults it adds, and ``Sim(world,
    #: drawn)``, the facet in one simulated world (its operator's actions, its part of each
    #: simulated process, its invariants checked after every step)
    sim: str | None = None
    #: its benchmarks (``python -m benchmarks NAME``), by name: the module of each, in its
    #: folder, whose ``run(quick)`` gives the rows (``benchmarks/kit/catalog.py`` lists them
    #: beside the modules of ``benchmarks/``; a name may be neither's twice)
    benchmarks: Mapping[str, str] = field(default_factory=dict)


#: each facet package's plugin, once imported (a memo of the import, like ``sys.modules``)
_loaded: dict[str, FacetPlugin] = {}


class Facets:
    """One composition of facets: the plugins of the packages it was built from (the built-in
    ones first, in their order), and every table the layers read of them: the record kinds a
    log accepts, the update and event readers, the rows, batch keys, projection and
    heartbeat-class kinds. A value: whoever composes the facets builds one and hands it to the
    log (``Log.accept``), the fold (``Coordinator(facets)``) and the readers, so two hosts with
    different facets live in one process; building one changes nothing outside it."""

    def __init__(self, packages: Iterable[str] | str | None = ()) -> None:
        if isinstance(packages, str) or packages is None:
            packages = [p.strip() for p in (packages or "").split(",")]
        #: the packages beside the built-in facets, in the order given
        self.installed: tuple[str, ...] = tuple(
            dict.fromkeys(p for p in packages if p and p not in BUILTIN_FACETS)
        )
        #: every facet, in the fixed order their hooks run
        self.plugins: tuple[FacetPlugin, ...] = tuple(
            _load(name) for name in (*BUILTIN_FACETS, *self.installed)
        )
        seen: dict[str, str] = dict.fromkeys(MEMBERSHIP_KINDS, "membership")
        names: set[str] = set()
        for plugin in self.plugins:
            if plugin.name in names:
                raise ValueError(f"two facets are named {plugin.name!r}")
            names.add(plugin.name)
            for kind in plugin.kinds:
                if kind in seen:
                    raise ValueError(
                        f"{seen[kind]!r} and facet {plugin.name!r} both declare record kind "
                        f"{kind!r}"
                    )
                seen[kind] = plugin.name
        #: every record kind the facets own
        self.kinds: frozenset[str] = check_kinds(k for p in self.plugins for k in p.kinds)
        #: every record kind the fold knows and the log accepts: membership's and the facets'
        self.all_kinds: frozenset[str] = MEMBERSHIP_KINDS | self.kinds
        #: the updates a reader of this composition decodes: the protocol's and the facets'
        self.updates: UpdateReader = PROTOCOL_UPDATES.with_types(
            *(u for p in self.plugins for u in p.updates)
        )
        #: the agent events ``POST /agents/events`` takes: the protocol's and the facets'
        self.events: EventReader = PROTOCOL_READER.with_types(
            *(e for p in self.plugins for e in p.events)
        )
        #: every facet's projection rows, by effect type
        self.rows_table: dict[type[Effect], RowsOf] = {
            t: f for p in self.plugins for t, f in p.rows.items()
        }
        #: every facet's batch keys, by record kind
        self.batch_keys: dict[str, Callable[[dict[str, Any]], tuple[Any, ...] | None]] = {
            k: f for p in self.plugins for k, f in p.batch_key.items()
        }
        #: every facet's projection kinds, in the facets' order
        self.projection_kinds: tuple[str, ...] = tuple(
            k for p in self.plugins for k in p.projection_kinds
        )
        #: the facets' heartbeat-class kinds (retention may remove them)
        self.compactable: frozenset[str] = frozenset().union(*(p.compactable for p in self.plugins))

    def __repr__(self) -> str:
        return f"Facets({[p.name for p in self.plugins]})"


#: The composition the command line made (:func:`install`): built-in facets until it is called.
_default: Facets | None = None


def install(packages: Iterable[str] | str | None) -> Facets:
    """The command line's composition: the built-in facets and a deployment's own (packages,
    or one comma-separated string), which the layers that take no :class:`Facets` of their
    own read (:func:`default`). Replaces what was installed before; the packages are imported
    at once, so a wrong name fails here, naming it."""
    global _default
    _default = Facets(packages)
    return _default


def default() -> Facets:
    """The composition the command line installed (:func:`install`), or the built-in facets."""
    global _default
    if _default is None:
        _default = Facets()
    return _default


#: :func:`default` by the name its readers use beside their own ``facets``
default_facets = default


def installed() -> tuple[str, ...]:
    """The packages installed beside the built-in facets (:func:`install`)."""
    return default().installed


def plugins() -> tuple[FacetPlugin, ...]:
    """Every facet of :func:`default`, in the fixed order their hooks run."""
    return default().plugins


def kinds() -> frozenset[str]:
    """Every record kind the facets of :func:`default` own."""
    return default().kinds


def all_kinds() -> frozenset[str]:
    """Every record kind the fold of :func:`default` knows: membership's and the facets'."""
    return default().all_kinds


def projection_kinds() -> tuple[str, ...]:
    """Every facet's projection kinds, in the facets' order (:func:`default`)."""
    return default().projection_kinds


def compactable() -> frozenset[str]:
    """The facets' heartbeat-class kinds (retention may remove them; :func:`default`)."""
    return default().compactable


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
    """The module of a plugin's ``host``, ``routes``, ``plot``, ``serve`` or ``sim`` part (None
    if it has none).
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
        _loaded[package] = plugin
    return plugin
