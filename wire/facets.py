"""The facets of foldplane, by package, in the order their hooks run: the one line that plugs a
facet of foldplane in, read by both sides. The server's registry loads each one's declaration
(``coordinator/fold/registry.py``); the worker side each one's part of the protocol, where it
declares one (:func:`protocols`: the agent's readers, ``agent/facets.py``, and the protocol's
reference, ``wire/reference.py``), and, where that part names one (:class:`WorkerPart`), the
facet's worker part, which the agent loads by name as well. A string names each, so no module imports a facet: they are
loaded by name, when asked for, as the registry loads their declarations.

This module is pure: no I/O, clock, threads or randomness.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass
from types import ModuleType

#: The facets of foldplane, by package, in the order their hooks run.
BUILTIN_FACETS: tuple[str, ...] = (
    "foldplane.facets.epochs",
    "foldplane.facets.refits",
    "foldplane.facets.lighthouse",
    "foldplane.facets.rendezvous",
)


def protocols(packages: Iterable[str] = BUILTIN_FACETS) -> tuple[ModuleType, ...]:
    """The part of the protocol each of ``packages`` declares in its folder (its ``protocol``
    module: ``UPDATES``, the updates its workers receive, and ``EVENTS``, the events they
    send), for those that declare one, in their order. Loads only those modules (and the
    facets' packages, which load nothing of their server side until asked)."""
    found = []
    for package in packages:
        name = f"{package}.protocol"
        if importlib.util.find_spec(name) is not None:
            found.append(importlib.import_module(name))
    return tuple(found)


@dataclass(frozen=True)
class WorkerPart:
    """A facet's worker part, as its ``protocol`` module declares it (its ``WORKER``): the
    module of its folder that holds it (``worker``: the tracker of what the coordinator said,
    the hooks the agent calls), which follows the facet's ``UPDATES``, alone sends its
    ``EVENTS`` and is given their answers; ``offers``: the names of that part the ``Agent``
    answers as its own (``agent.refit(name)``), so the agent names no facet. The module's
    ``WORKER`` makes the part from what the agent gives it (``agent.facets.WorkerSide``); the
    agent loads it when the part is first needed, so importing the agent loads none."""

    module: str = "worker"
    offers: tuple[str, ...] = ()
