"""The one exception the data plane raises: local misuse, never a peer's failure."""

from __future__ import annotations


class DataPlaneError(RuntimeError):
    """A local misuse of the data plane: a closed group, no view installed yet, a conflicting view.

    A peer's failure is never raised; it is reported by ``Work.wait() == False`` and the hint.
    Bad arguments (a rank out of range, a wrong tensor list) raise ``ValueError``/``TypeError``.
    """


class PeerFailure(RuntimeError):
    """A synchronous ``dist.*`` call on the foldplane group failed because peers failed.

    Raised only where torch would otherwise ignore the failure (a synchronous c10d call);
    ``failed_ranks`` is the operation's hint as a list (possibly empty: an operation that timed
    out with every member alive blames nobody), ``hint`` the int32 tensor itself.
    """

    def __init__(self, op: str, failed_ranks: list[int], hint: object) -> None:
        self.op = op
        self.failed_ranks = failed_ranks
        self.hint = hint
        who = f"rank(s) {failed_ranks} failed" if failed_ranks else "a peer failed or timed out"
        super().__init__(f"{op}: {who}; the output is unspecified until the next view")


class ReconfigureError(RuntimeError):
    """A reconfigure did not take effect (torch's ``ProcessGroup.reconfigure``: its ``Work``
    raises this). ``code`` is the coordinator's (a refusal such as ``reconfigure_uuid_used``,
    or the proposal's status ``rejected`` / ``applied_with_dropped_ranks``), ``detail`` why,
    with the ranks, incarnations and versions involved. The process keeps the configuration it
    had; the members call again with a fresh uuid."""

    def __init__(self, code: str, detail: str) -> None:
        self.code = code
        self.detail = detail
        super().__init__(f"reconfigure failed ({code}): {detail}")
