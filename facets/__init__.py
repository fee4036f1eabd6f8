"""The facets of foldplane: kinds of state beside membership, one package each.

Each package declares its ``PLUGIN`` (``coordinator/fold/registry.py``) and holds every part of
its facet: the fold object and its refusals, its effects, its projection rows and agent updates,
what its effects ask of the host and what a resync sends (``host.py``), its story, its HTTP
routes and its lane in ``replay --plot``. The pure parts (the fold, effects, rows) and the parts
that do I/O are separate modules, so the import contracts check each against its layer.
"""
