"""foldplane: an event-sourced control plane for elastic torch.distributed process groups.

The repository's root is the package ``foldplane``: each top folder is one of its packages
(``agent/`` is ``foldplane.agent``, ``coordinator/`` is ``foldplane.coordinator``), and its
modules import each other relatively (``from ..wire.protocol import View``), so every module
has the one name ``foldplane.<folder>...`` in a checkout (installed editable) and in a wheel,
and a user's own ``agent.py``, ``api/``, ``wire.py`` or ``eventlog.py`` beside a training script
cannot take a foldplane module's place. ``tests/``, ``docs/``, ``examples/`` and ``scripts/`` are
not packages of it.

The one short name left is the card's ``python -m coordinator ...`` in the repository's root:
``coordinator/__init__.py`` is empty and ``coordinator/__main__.py`` a door to
``foldplane.cli``'s ``main``, so no code is loaded under the name ``coordinator``.
"""
