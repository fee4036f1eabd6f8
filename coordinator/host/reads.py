"""The read model: what the API may read of the fold, through the host.

The API never holds the fold (``coordinator/fold/machine.py``): it reads ``host.reads``, this
object, and the import contracts forbid its modules to import the fold's state and rules. Every
answer is plain data or a frozen value (a ``View``, a ``Proposal``, a ``GroupConfig``), read
between two of the host's steps: the host's loop and the routes share one event loop, so an
answer reflects exactly one fold offset (:attr:`Reads.offset`) and a route never sees half a
step. The composite answers (a group's status, the group list, the console's overview) are
computed once per fold offset and kept until the fold moves on, so many readers in one cycle
share one computation (and never edit it). A facet's queries (``facet(name)``) are its fold object's query methods
(``status``, ``job``, ...), called the same way.
"""

from __future__ import annotations

from typing import Any

from ..fold.config import GroupConfig
from ..fold.effects import Proposal, View
from ..fold.machine import Coordinator
from ..fold.overview import group_list, group_overview


class Reads:
    """The fold as the API reads it (see the module docstring)."""

    def __init__(self, machine: Coordinator) -> None:
        self._machine = machine
        self._at = -1
        self._memo: dict[tuple[str, str | None], Any] = {}

    def _kept(self, key: tuple[str, str | None], compute: Any) -> Any:
        """``compute()`` once per fold offset; the answer is shared, so callers never edit it
        (they copy what they change)."""
        offset = self._machine.offset
        if offset != self._at:
            self._at, self._memo = offset, {}
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    @property
    def offset(self) -> int:
        """The offset of the last record the fold stepped."""
        return self._machine.offset

    def groups(self) -> list[str]:
        return self._machine.groups()

    def group_deleted(self, group: str) -> bool:
        return self._machine.group_deleted(group)

    def group_config(self, group: str) -> GroupConfig | None:
        return self._machine.group_config(group)

    def current_view(self, group: str) -> View | None:
        return self._machine.current_view(group)

    def proposal(self, id: int) -> Proposal | None:
        return self._machine.proposal(id)

    def proposal_by_uuid(self, group: str, uuid: int) -> Proposal | None:
        return self._machine.proposal_by_uuid(group, uuid)

    def group_status(self, group: str) -> dict[str, Any] | None:
        """``GET /groups/{group}``'s data (None: no such group)."""
        return self._kept(("status", group), lambda: self._machine.group_status(group))

    def group_list(self) -> list[dict[str, Any]]:
        """One line per group that was not deleted (``GET /groups``, the console)."""
        return self._kept(("list", None), lambda: group_list(self._machine))

    def group_overview(self, group: str) -> dict[str, Any] | None:
        """The console's picture of one group (None: no such group)."""
        return self._kept(("overview", group), lambda: group_overview(self._machine, group))

    def facet(self, name: str) -> Any:
        """The facet ``name``'s fold object, for its query methods (KeyError: none such)."""
        return self._machine.facet(name)
