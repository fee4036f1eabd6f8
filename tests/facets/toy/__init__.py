"""A toy facet that plugs into foldplane the way every facet does: one folder, one line.

Its kind of state is a per-group counter the operator bumps (``POST /groups/{group}/toy``) and
the group's ranks add to (``Agent.send_event(AddEvent, by=...)``): two record kinds
(``toy_bump``, ``toy_add``), an agent event, refusals, a projection row (``toy_counter``), an
update to the group's agents, a route, a panel in the operator's console and an option of
``serve`` (``--toy-note FILE``) and a benchmark (``python -m benchmarks toy``). The line that plugs it in is ``FOLDPLANE_FACETS=tests.facets.toy``
(``coordinator/fold/registry.py``); nothing of foldplane names it. Its declaration is
``plugin.py``, loaded when the registry asks for ``PLUGIN``, so a worker that reads its
protocol and worker part (``protocol.py``, ``worker.py``) loads nothing of its server side.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    # the declaration names the fold: loaded when the registry asks for it
    if name == "PLUGIN":
        from tests.facets.toy.plugin import PLUGIN

        return PLUGIN
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
