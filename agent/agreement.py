"""The step agreement of the elastic wrappers (``agent.ddp``, ``agent.fsdp``): every member of a
view commits or skips the same steps.

After a step's collectives each member votes in the coordinator's store: the last of the
view's members to vote "ok" writes ``commit``; a member whose collectives failed, or that sees
the view fail or a member leave while it waits, writes ``skip`` instead. The first write wins
(``compare_set``) and everybody adopts it, so the members' state stays identical after every
step (``agent.elastic.ElasticStep`` runs it).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import queue
import threading
import time
import weakref
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

from torch.distributed import DistStoreError

from .dataplane.plane import DataPlane
from .dataplane.view import ViewGroup

log = logging.getLogger("foldplane.agreement")

#: How often a member waiting for the step's decision looks at its view's health (locally:
#: the wait itself is one store wait that the decision, or the watch's ``skip``, ends).
DECISION_SLICE_S = 0.02
#: How long past the collective timeout a decision wait may last before it gives up on the
#: watch (whose ``skip`` at the deadline normally ends it first).
DECISION_GRACE_S = 5.0
COMMIT, SKIP = b"commit", b"skip"
#: How long ``close`` waits for the threads it stops (a store call in flight ends first).
CLOSE_WAIT_S = 5.0


class StepAgreement:
    """Every member's vote on each step of a view, in the coordinator's store.

    ``agree(view, index, ok)``: the last of the view's members to vote "ok" on step ``index``
    writes ``commit``; a member that votes not ok, or that sees the view fail or lose a member
    (or the collective timeout pass) while it waits, writes ``skip``. The first write wins
    (``compare_set``) and every member adopts it. ``prefix`` keeps the keys of two users of one
    group apart. Three store round trips per step.

    ``close`` stops its threads (the janitor's and the decision watch's, each with a store
    client of its own) and waits for them, bounded; so does an exit hook for an agreement the
    program left open: a daemon thread that returns from a store call while the interpreter
    shuts down aborts the process ("terminate called without an active exception").
    """

    def __init__(self, plane: DataPlane, prefix: str) -> None:
        self._plane = plane
        self._prefix = prefix
        self._store: Any = None
        self._store_address: tuple[str, int] | None = None
        self._janitor: Janitor | None = None
        self._watch: DecisionWatch | None = None
        atexit.register(_close_at_exit, weakref.ref(self))

    def agree(self, view: ViewGroup, index: int, ok: bool) -> bool:
        """True if step ``index`` of ``view`` is committed on every member (False: skipped)."""
        store = self.store()
        base = f"{self._prefix}/{view.version}/{index}"
        decision = f"{base}/decision"
        try:
            if not ok:
                return store.compare_set(decision, "", SKIP) == COMMIT
            if store.add(f"{base}/ok", 1) == len(view.members):
                answer = store.compare_set(decision, "", COMMIT)
                if answer == COMMIT and index > 0:  # every member is past step index - 1
                    done = f"{self._prefix}/{view.version}/{index - 1}"
                    assert self._janitor is not None  # made with the store
                    self._janitor.forget(f"{done}/ok", f"{done}/decision")
                return answer == COMMIT
            return self._await_decision(store, view, decision)
        except RuntimeError as e:  # the store is unreachable: the step cannot be agreed
            rank = self._plane.rank
            log.error(
                "rank %d: cannot agree on step %d of view %d: %s", rank, index, view.version, e
            )
            self._store = None
            return False

    def _await_decision(self, store: Any, view: ViewGroup, decision: str) -> bool:
        """Wait for ``decision`` in one store wait: the last "ok" vote ends it with ``commit``,
        the watch (:class:`DecisionWatch`) with ``skip`` once the view fails, a member leaves
        or the deadline passes. A wait that ends by its own timeout makes torch's store client
        log a warning; this one times out only if the watch could not write (the store is
        gone), so a worker's recovery stays quiet."""
        plane = self._plane
        deadline = time.monotonic() + plane.collective_timeout_s
        limit = timedelta(seconds=plane.collective_timeout_s + DECISION_GRACE_S)
        assert self._watch is not None  # made with the store
        # A timeout: nobody wrote it, not even the watch (the store is gone): skipped.
        with self._watch.watching(view, decision, deadline), contextlib.suppress(DistStoreError):
            store.wait([decision], limit)
        # Present now: compare_set answers its value in one round trip (get takes two).
        return store.compare_set(decision, "", SKIP) == COMMIT

    def reset(self) -> None:
        """Forget the store client (it failed): the next use connects again."""
        self._store = None

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Stop the janitor's and the decision watch's threads and wait up to ``timeout`` s for
        both to end: True if they did (a later use connects again)."""
        janitor, watch = self._janitor, self._watch
        self._store = self._store_address = self._janitor = self._watch = None
        deadline = time.monotonic() + timeout
        ended = True
        for part in (watch, janitor):
            if part is not None:
                ended = part.close(max(0.0, deadline - time.monotonic())) and ended
        if not ended:
            log.warning(
                "rank %d: a thread of the step agreement is still in a store call after close",
                self._plane.rank,
            )
        return ended

    def store(self) -> Any:
        """A store client of our own (a wait here must not hold up the heartbeat's client);
        the elastic DDP also publishes its heal servers through it."""
        plane = self._plane
        address = plane.store_address
        if self._store is None or self._store_address != address:
            self._store = plane.connect_store(*address)
            self._store_address = address
            if self._janitor is not None:  # the old store's: ends after its deletes
                self._janitor.close(0.0)
            self._janitor = Janitor(plane.connect_store(*address))
            if self._watch is not None:
                self._watch.close(0.0)
            self._watch = DecisionWatch(plane, plane.connect_store(*address))
        return self._store


class DecisionWatch:
    """Ends a member's wait for a step's decision when no vote will: writes ``skip`` (first
    write wins, as any member's) once the view fails, one of its members is left out of the
    installed view, or the deadline passes.

    It looks locally every ``DECISION_SLICE_S`` while a wait is in progress (no store round
    trip), from a thread of its own with a store client of its own: the waiting thread is
    blocked in the store's wait on the other client.
    """

    def __init__(self, plane: DataPlane, store: Any) -> None:
        self._plane = plane
        self._store = store
        self._cond = threading.Condition()
        self._watched: tuple[ViewGroup, str, float] | None = None
        self._closed = False
        self._thread = threading.Thread(
            target=self._run, name="foldplane-decision-watch", daemon=True
        )
        self._thread.start()

    def close(self, timeout: float) -> bool:
        """Stop the thread (the agreement moved to another store, or closes) and wait up to
        ``timeout`` s for it to end: True if it did."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @contextlib.contextmanager
    def watching(self, view: ViewGroup, decision: str, deadline: float) -> Iterator[None]:
        with self._cond:
            self._watched = (view, decision, deadline)
            self._cond.notify_all()
        try:
            yield
        finally:
            with self._cond:
                self._watched = None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._watched is not None or self._closed)
                if self._closed:
                    return
                watched = self._watched
                assert watched is not None
                view, decision, deadline = watched
                while (
                    self._watched is watched and not self._closed and not self._ends(view, deadline)
                ):
                    self._cond.wait(DECISION_SLICE_S)
                if self._closed:
                    return
                if self._watched is not watched:
                    continue  # decided meanwhile
            try:
                self._store.compare_set(decision, "", SKIP)
            except RuntimeError as e:  # the waiter's own wait times out instead
                log.info("rank %d: cannot end the wait for %s: %s", self._plane.rank, decision, e)
            with self._cond:  # the same wait is not ended twice
                self._cond.wait_for(lambda w=watched: self._watched is not w or self._closed)

    def _ends(self, view: ViewGroup, deadline: float) -> bool:
        """No vote will end the wait: the view failed, lost a member, or its time is up."""
        current = self._plane.current_view()
        gone = current is not None and not set(view.members) <= set(current.members)
        return view.failure is not None or gone or time.monotonic() > deadline


class Janitor:
    """Deletes the keys of decided steps on a thread of its own (off the step's critical path),
    with a store client of its own. ``close`` stops it."""

    def __init__(self, store: Any) -> None:
        self._store = store
        #: keys to delete; None: stop
        self._queue: queue.SimpleQueue[tuple[str, ...] | None] = queue.SimpleQueue()
        self._unfinished = 0  # ``forget`` calls whose keys are not deleted yet
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="foldplane-janitor", daemon=True)
        self._thread.start()

    def forget(self, *keys: str) -> None:
        with self._idle:
            self._unfinished += 1
        self._queue.put(keys)

    def wait_idle(self, timeout: float) -> bool:
        """Wait until every key given so far is deleted; False on timeout (or a failed delete)."""
        with self._idle:
            return self._idle.wait_for(lambda: self._unfinished == 0, timeout)

    def close(self, timeout: float) -> bool:
        """Stop the thread once the keys given so far are deleted (or a delete failed) and wait
        up to ``timeout`` s for it to end: True if it did."""
        self._queue.put(None)
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while True:
            keys = self._queue.get()
            if keys is None:
                return
            try:
                for key in keys:
                    self._store.delete_key(key)
            except RuntimeError as e:  # the store moved or is down: the keys are only clutter
                log.info("cannot delete %s: %s", ", ".join(keys), e)
                return
            with self._idle:
                self._unfinished -= 1
                self._idle.notify_all()


def _close_at_exit(ref: weakref.ref[StepAgreement]) -> None:
    """Close an agreement the program left open (its threads must end before the interpreter)."""
    agreement = ref()
    if agreement is not None:
        agreement.close()


__all__ = ["COMMIT", "SKIP", "DecisionWatch", "Janitor", "StepAgreement"]
