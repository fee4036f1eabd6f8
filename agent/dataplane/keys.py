"""The data plane's key layout in the coordinator's TCPStore, declared in one place.

Every key is relative to the data plane's store prefix (empty by default; a coordinator that
serves several groups from one store hands each group its own prefix).

- ``hb/<rank>/<incarnation>``: the liveness counter a process's heartbeat thread increments.
  Keyed by incarnation, so a replacement process for a rank never vouches for the dead one.
- ``incarnation/<rank>``: the latest incarnation that started a data plane for ``rank``.
- ``members/<version>/<rank>``: the incarnation that took part in view ``version`` as ``rank``.
- ``fail/<version>/<rank>``: the key ``rank``'s watcher waits on for view ``version``: a poison
  notice (JSON, see :mod:`agent.dataplane.poison`) or ``retired`` when the rank itself moved on.
- ``poisoned/<version>``: the same notice, once per view: a rank that moved on from the view
  while operations of its own were still in flight there waits on it (its ``fail`` key then
  belongs to the watcher of its new view).
- ``nccl-fate/<version>``: what becomes of view ``version``'s NCCL communicator once it is given
  up, decided once for every member by the first to write it (``compare_set``): ``abort``, or
  ``shrink:<next>`` (the members of view ``next``, a subset, shrink it into theirs).
- ``view/<version>/``: the prefix under which the backend of view ``version`` rendezvouses
  (``view/<version>/cuda/`` its NCCL communicator, when it is built fresh). A view that torch's
  reconfigure committed numbers its members in the handles' order, and the group of torch's
  model takes its backends (:mod:`agent.dataplane.reconfigure`).
- ``gloo-handle/<version>/<rank>``: ``rank``'s reconfigure handle of its gloo backend for view
  ``version``, when views reconfigure one backend (:mod:`agent.dataplane.persistent`); that
  backend rendezvouses under ``gloo/reconfigure/<uuid>/`` (gloo's own layout).
- ``subgroup/<version>/<name>/``: the prefix under which torch's subgroup ``name`` (from
  ``dist.new_group``) rendezvouses, made while view ``version`` was installed.
"""

from __future__ import annotations

RETIRED = b"retired"


def heartbeat(rank: int, incarnation: str) -> str:
    return f"hb/{rank}/{incarnation}"


def incarnation(rank: int) -> str:
    return f"incarnation/{rank}"


def member(version: int, rank: int) -> str:
    return f"members/{version}/{rank}"


def fail(version: int, rank: int) -> str:
    return f"fail/{version}/{rank}"


def poisoned(version: int) -> str:
    return f"poisoned/{version}"


def nccl_fate(version: int) -> str:
    return f"nccl-fate/{version}"


def rendezvous_prefix(version: int) -> str:
    return f"view/{version}/"


def subgroup_prefix(version: int, name: str) -> str:
    return f"subgroup/{version}/{name}/"


def gloo_handle(version: int, rank: int) -> str:
    return f"gloo-handle/{version}/{rank}"
