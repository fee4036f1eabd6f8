"""A refit world: the M publishers and N subscribers of one attempt, and the transfers over it.

``open_world(plan, side, slot, bootstrap, lanes)`` is called by every member of an admitted
refit (the control plane has checked that all of them hold the same plan digest and hands them
the same bootstrap and lane count). It builds a world of ``M + N`` ranks on the bootstrap's
TCPStore, under the bootstrap's prefix: publisher slot ``s`` is rank ``s``, subscriber slot
``s`` is rank ``M + s``. The world has ``lanes`` process groups, each over all ``M + N`` ranks:
a lane is its own set of connections, so the pieces on different lanes move in parallel
between the same two members.

``world.transfer(tensors)`` moves one set of weights: every member derives the same
:func:`wire.refit.schedule` from the plan and posts its sends (publisher) or receives
(subscriber) of that schedule, each piece on its lane under its own tag, so that no member
sends everything and no member waits for another's turn. A subscriber receives straight into
its own tensors where the piece's region of them is contiguous, and through a buffer otherwise
(a region cut across a non-leading dimension); a publisher sends views of its own tensors where
contiguous. A transfer ends when every member has finished its part (a count in the store), so
a publisher that returns knows every subscriber holds the new weights. A world can carry many
transfers, one at a time.

Failure, bounded in seconds: each member's liveness thread bumps a counter in the store every
``heartbeat_s``. A transfer fails when one of its operations fails (a peer's connection broke),
when a member's counter stalls for ``stall_s``, when another member left a failure notice in the
store, when the coordinator's verdict says the world's epoch is over (``verdict``: a member went
OFFLINE, a view committed), or at ``timeout_s``. The verdict is what covers the store's own
host, publisher slot 0: when it dies the store dies with it, so no counter or notice can be
read; the coordinator sees that death as any member's (its launcher's report, its heartbeats)
and moves the refit's epoch, which every member's agent hears, and each member's watch reads it
without asking the store. The first member to fail leaves the notice, so the others fail at
their next look (every ``heartbeat_s``) instead of at a timeout; each one then compares the
counters over three heartbeats and raises :class:`RefitFailed` naming the members whose counter
did not move. The world is then closed, for good: its backends are abandoned (released in a
reaper thread, since a gloo backend with an operation stuck on a dead peer blocks its
destructor) and every later call raises :class:`RefitClosed`. The next attempt opens a new
world under a new bootstrap prefix (:meth:`agent.refit.RefitStore.bootstrap`), never the old
one's keys.

Backends: gloo on the CPU (what the tests run) and NCCL when the bootstrap says ``"nccl"`` and
CUDA is available (the tensors on the current CUDA device). The NCCL path builds one
``ProcessGroupNCCL`` per lane with the same calls (``agent.dataplane.backend.BackendKind``),
follows each operation's end on the GPU as the data plane does (``agent.dataplane.cuda``),
orders the caller's stream after them, and aborts its backends on failure; ``tests/gpu`` checks
it on a GPU machine.

Boundary with the control plane: the control plane admits members, checks digests, picks the
lane count and carries the bootstrap; this module only checks, as a last guard, that every
member of the world opened it with the same digest and lane count.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
from torch.distributed import PrefixStore, TCPStore

from ...wire.refit import (
    SIDES,
    Bootstrap,
    Piece,
    ReshardPlan,
    Side,
    decode_bootstrap,
    digest,
    schedule,
)
from ..dataplane.backend import BackendKind, bury
from ..dataplane.cuda import EndEvents, nccl_error
from .errors import Peer, RefitClosed, RefitError, RefitFailed, Verdict
from .tensors import dtype_of

#: How often a member polls the store while it waits for the others to finish a transfer.
POLL_S = 0.005
#: How often a lane's waiter looks at a NCCL operation's end event.
NCCL_POLL_S = 0.0005
#: Side streams on which each NCCL operation's end event is recorded (one per device).
_END_EVENTS = EndEvents()
#: The least bound on a store client's connect and on a store reply.
STORE_TIMEOUT_S = 30.0
#: How long a member that found the store gone waits for the coordinator's verdict, which
#: names who died: a launcher's death report reaches it in well under a second, a stopped
#: heartbeat within the group's ``heartbeat_timeout_s``.
VERDICT_WAIT_S = 10.0
#: The longest a formation waits on the store before it looks at the coordinator's verdict.
FORM_SLICE_S = 0.25


@dataclass(frozen=True)
class TransferReport:
    """What one member did in one transfer."""

    transfer: int
    peer: Peer
    pieces: int
    bytes_sent: int
    bytes_received: int
    seconds: float
    #: the wall clock (``time.time()``) when this member posted its first send or receive on a
    #: lane; None when it had no piece in this transfer
    first_posted_at: float | None = None


class _Liveness:
    """The member's liveness counter, bumped every ``period`` by a daemon thread (own client)."""

    def __init__(self, store: Any, key: str, period: float) -> None:
        self._store, self._key, self._period = store, key, period
        self._stop = threading.Event()
        store.add(key, 1)  # exists before the member checks in
        self._thread = threading.Thread(target=self._run, name="refit-liveness", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._period):
            try:
                self._store.add(self._key, 1)
            except RuntimeError:  # the store is gone; the transfer will see it too
                return

    def stop(self) -> None:
        self._stop.set()


class RefitWorld:
    """One attempt's world, as seen by one member; built by :func:`open_world`."""

    def __init__(
        self,
        plan: ReshardPlan,
        side: Side,
        slot: int,
        bootstrap: Bootstrap,
        lanes: int,
        timeout_s: float,
        heartbeat_s: float,
        stall_s: float,
        gloo_hostname: str | None,
        device: torch.device | str | None = None,
        verdict: Callable[[], Verdict | None] | None = None,
    ) -> None:
        self.plan = plan
        self._verdict = verdict
        self.peer = Peer(side, slot)
        self.bootstrap = bootstrap
        self.lanes = lanes
        self.digest = digest(plan)
        self.schedule = schedule(plan, lanes)
        self._timeout_s = timeout_s
        self._heartbeat_s = heartbeat_s
        self._stall_s = stall_s
        self._m = plan.publisher.mesh.size
        self._n = plan.subscriber.mesh.size
        self.world_size = self._m + self._n
        self.rank = slot if side == "publisher" else self._m + slot
        self._transfers = 0
        self._closed = False
        self._failed = False
        self._backends: list[object] = []
        host, port = bootstrap.address
        self._kind = BackendKind.resolve(
            bootstrap.backend,
            None if device is None else torch.device(device),
            gloo_hostname or _gloo_hostname(host),
        )
        # The store clients' own bound (connecting, and a reply that never comes) is at least
        # STORE_TIMEOUT_S, so that a loaded machine's slow connect is not taken for a failure.
        timeout = timedelta(seconds=max(timeout_s, STORE_TIMEOUT_S))
        self._client = TCPStore(host, port, is_master=False, timeout=timeout)
        self._store = PrefixStore(f"refit/{bootstrap.prefix}/", self._client)
        hb_client = TCPStore(host, port, is_master=False, timeout=timeout)
        self._hb_store = PrefixStore(f"refit/{bootstrap.prefix}/", hb_client)
        self._liveness = _Liveness(self._hb_store, f"hb/{self.rank}", heartbeat_s)
        try:
            self._form()
        except BaseException:
            self._failed = True
            self._close_quietly()
            raise

    # -- formation ---------------------------------------------------------------------------

    def _peer(self, rank: int) -> Peer:
        return Peer("publisher", rank) if rank < self._m else Peer("subscriber", rank - self._m)

    def _form(self) -> None:
        """Check in, wait for every member (naming the absent at the deadline), agree, connect."""
        me = json.dumps({"digest": self.digest, "lanes": self.lanes}, sort_keys=True)
        self._store.set(f"join/{self.rank}", me)
        keys = [f"join/{r}" for r in range(self.world_size)]
        deadline = time.monotonic() + self._timeout_s
        while True:
            # The store answers the moment the last key is set; the wait is cut in slices so
            # that the coordinator's verdict (a member that will never join: it went OFFLINE,
            # the store's host among them) ends it at once instead of at the deadline.
            left = deadline - time.monotonic()
            try:
                self._store.wait(keys, timedelta(seconds=max(0.001, min(FORM_SLICE_S, left))))
                break
            except RuntimeError as exc:  # a slice, the deadline, or the store gone
                try:
                    absent = [
                        self._peer(r) for r, k in enumerate(keys) if not self._store.check([k])
                    ]
                except RuntimeError:
                    verdict = self._await_verdict()  # the store's host may be who died
                    reason = f"the store at {self.bootstrap.store} is unreachable: {exc}"
                    if verdict is None:
                        raise RefitFailed(0, (), reason) from exc
                    raise RefitFailed(0, verdict.dead, f"{reason}; {verdict.reason}") from exc
                if not absent:
                    break  # the last one joined as the slice ended: go on
                verdict = None if self._verdict is None else self._verdict()
                if verdict is not None:
                    raise RefitFailed(
                        0,
                        verdict.dead,
                        f"{', '.join(map(str, absent))} had not joined; {verdict.reason}",
                    ) from exc
                if time.monotonic() >= deadline:
                    raise RefitFailed(
                        0,
                        (),
                        f"{', '.join(map(str, absent))} never joined within {self._timeout_s} s",
                    ) from exc
        joined = [json.loads(v) for v in self._store.multi_get(keys)]
        differ = [self._peer(r) for r, j in enumerate(joined) if j != json.loads(me)]
        if differ:
            raise RefitError(
                f"{', '.join(map(str, differ))} opened the world with another plan or lane "
                f"count than {self.peer} (digest {self.digest[:12]}, {self.lanes} lanes): "
                + "; ".join(f"{self._peer(r)}: {joined[r]}" for r in range(len(joined)))
            )
        for lane in range(self.lanes):
            try:
                backend = self._kind.create(
                    PrefixStore(f"lane/{lane}/", self._store),
                    self.rank,
                    self.world_size,
                    self._timeout_s,
                )
            except RuntimeError as exc:  # a member that joined died before its lanes connected
                raise RefitFailed(
                    0, (), f"{self.peer} could not connect lane {lane} of the world: {exc}"
                ) from exc
            self._backends.append(backend)

    # -- transfers -----------------------------------------------------------------------------

    def local_tensors(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """The shape and dtype of each tensor this member passes to :meth:`transfer`."""
        layout = self.plan.layout(self.peer.side)  # type: ignore[arg-type]
        out = {}
        for p in layout.params:
            shape = layout.local_shape(p.name, self.peer.slot)
            if shape is not None:
                out[p.name] = (shape, dtype_of(p.dtype))
        return out

    def _check_tensors(self, tensors: Mapping[str, torch.Tensor]) -> None:
        want = self.local_tensors()
        missing, extra = want.keys() - tensors.keys(), tensors.keys() - want.keys()
        if missing or extra:
            raise RefitError(
                f"{self.peer} holds {sorted(want)} under this plan; "
                f"missing {sorted(missing)}, not in the plan {sorted(extra)}"
            )
        for name, (shape, dtype) in want.items():
            t = tensors[name]
            if tuple(t.shape) != shape or t.dtype != dtype:
                raise RefitError(
                    f"{name}: {self.peer} must pass a {dtype} tensor of shape {list(shape)}, got "
                    f"{t.dtype} {list(t.shape)}"
                )
            if not t.is_contiguous():
                raise RefitError(f"{name}: the tensor must be contiguous")
            if t.device.type != self._kind.device.type:
                raise RefitError(
                    f"{name}: the {self.bootstrap.backend} world moves tensors on "
                    f"{self._kind.device}, got one on {t.device}"
                )

    def _local(self, piece: Piece, tensors: Mapping[str, torch.Tensor], slot: int, side: Side):
        """The view of ``tensors[piece.name]`` that is ``piece.region`` (global coordinates)."""
        layout = self.plan.layout(side)
        held = layout.local_region(layout.param(piece.name), slot)
        assert held is not None
        view = tensors[piece.name]
        for dim, ((lo, hi), (base, _)) in enumerate(zip(piece.region, held, strict=True)):
            view = view.narrow(dim, lo - base, hi - lo)
        return view

    def transfer(self, tensors: Mapping[str, torch.Tensor]) -> TransferReport:
        """Send (publisher) or receive into (subscriber) ``tensors``: this member's local tensors
        of every parameter it holds, named as in the plan (shapes: :meth:`local_tensors`).

        Returns when every member of the world has finished its part; raises
        :class:`RefitFailed` (and closes the world) when any member failed or died.
        """
        if self._closed:
            raise RefitClosed(
                f"the refit world {self.bootstrap.prefix!r} is closed; open a new world under "
                "a new bootstrap for the next attempt"
            )
        self._check_tensors(tensors)
        self._transfers += 1
        t = self._transfers
        start = time.monotonic()
        deadline = start + self._timeout_s
        side, slot = self.peer.side, self.peer.slot
        works: list[tuple[Any, Piece]] = []
        keep: list[torch.Tensor] = []  # buffers that must live until their operation ends
        unpack: list[tuple[torch.Tensor, torch.Tensor]] = []  # (received buffer, destination)
        misc_in: torch.Tensor | None = None
        sent = received = 0
        first_posted_at: float | None = None
        self._watch = _Watch(self, t)
        try:
            if side == "publisher":
                misc_out: torch.Tensor | None = None
                for piece in self.schedule.pieces:
                    if piece.src != slot:
                        continue
                    if piece.is_misc:
                        if misc_out is None:  # packed once, for the subscribers it serves
                            misc_out = self._pack_misc(tensors)
                        buf = misc_out
                    else:
                        buf = self._local(piece, tensors, slot, "publisher")
                        if not buf.is_contiguous():
                            buf = buf.contiguous()
                    keep.append(buf)
                    if first_posted_at is None:
                        first_posted_at = time.time()
                    work = self._backends[piece.lane].send([buf], self._m + piece.dst, piece.tag)
                    works.append((work, piece))
                    sent += piece.nbytes
            else:
                for piece in self.schedule.pieces:
                    if piece.dst != slot:
                        continue
                    if piece.is_misc:
                        misc_in = buf = torch.empty(
                            piece.nbytes, dtype=torch.uint8, device=self._kind.device
                        )
                    else:
                        dst = self._local(piece, tensors, slot, "subscriber")
                        if dst.is_contiguous():
                            buf = dst  # straight into the subscriber's tensor
                        else:
                            buf = torch.empty(dst.shape, dtype=dst.dtype, device=dst.device)
                            unpack.append((buf, dst))
                    keep.append(buf)
                    if first_posted_at is None:
                        first_posted_at = time.time()
                    works.append(
                        (self._backends[piece.lane].recv([buf], piece.src, piece.tag), piece)
                    )
                    received += piece.nbytes
            ends = self._wait_works(works, deadline)
            current = torch.cuda.current_stream(self._kind.device) if ends else None
            for end in ends:  # torch's contract: the caller's stream is ordered after them
                current.wait_event(end)  # type: ignore[union-attr]
            for buf, dst in unpack:
                dst.copy_(buf)
            if misc_in is not None:
                self._unpack_misc(misc_in, tensors)
            self._store.add(f"t{t}/done", 1)
            while self._store.add(f"t{t}/done", 0) < self.world_size:
                self._watch.look(deadline, "waiting for the other members to finish")
                time.sleep(POLL_S)
        except RefitFailed:
            bury(*(w for w, _ in works), *keep)
            raise
        except RuntimeError as e:  # the store or a backend broke outside an operation
            bury(*(w for w, _ in works), *keep)
            self._fail(t, f"{type(e).__name__}: {e}")
        return TransferReport(
            t, self.peer, len(works), sent, received, time.monotonic() - start, first_posted_at
        )

    def _wait_works(self, works: list[tuple[Any, Piece]], deadline: float) -> list[Any]:
        """Wait for this member's operations: one waiter thread per lane (gloo's send and receive
        complete only through ``wait()``, which blocks), while this thread keeps looking at the
        rest of the world once per heartbeat. A waiter left blocked on a failed world ends at
        the backend's timeout.

        On NCCL a work's ``wait()`` only orders a stream, so each waiter follows the operation's
        end event instead (:mod:`agent.dataplane.cuda`) until its kernels ended, the world
        failed or the deadline passed; the end events are returned, for the caller's stream
        to wait on.
        """
        by_lane: dict[int, list[tuple[Any, Piece]]] = {}
        for work, piece in works:
            by_lane.setdefault(piece.lane, []).append((work, piece))
        event = threading.Event()
        lock = threading.Lock()
        errors: list[tuple[Piece, BaseException]] = []
        finished = [0]
        nccl = self._kind.name == "nccl"
        ends = [_END_EVENTS.after(work, self._kind.device) for work, _ in works] if nccl else []
        end_of = {id(work): end for (work, _), end in zip(works, ends, strict=False)}

        def wait_gpu(work: Any) -> None:
            end = end_of[id(work)]
            while not end.query():
                if self._failed or self._closed or time.monotonic() > deadline:
                    raise RuntimeError("the operation did not end on the GPU before the deadline")
                error = nccl_error(work)
                if error:
                    raise RuntimeError(error)
                time.sleep(NCCL_POLL_S)

        def waiter(items: list[tuple[Any, Piece]]) -> None:
            for work, piece in items:
                try:
                    if nccl:
                        wait_gpu(work)
                    else:
                        work.wait()
                except RuntimeError as e:
                    with lock:
                        errors.append((piece, e))
                    event.set()
                    return
            with lock:
                finished[0] += 1
                if finished[0] == len(by_lane):
                    event.set()

        for lane, items in sorted(by_lane.items()):
            threading.Thread(
                target=waiter, args=(items,), name=f"refit-lane-{lane}", daemon=True
            ).start()
        while by_lane:
            event.wait(self._heartbeat_s)
            with lock:
                error = errors[0] if errors else None
                done = finished[0] == len(by_lane)
            if error is not None:
                piece, e = error
                other = piece.dst if self.peer.side == "publisher" else piece.src
                side = "subscriber" if self.peer.side == "publisher" else "publisher"
                self._fail(
                    self._transfers,
                    f"{piece.name or 'the misc payload'} (tag {piece.tag}, lane {piece.lane}) "
                    f"with {side} slot {other} failed: {e}",
                )
            if done:
                return ends
            self._watch.look(deadline, f"{len(works) - finished[0]} pieces pending")
        return ends

    def _pack_misc(self, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat(
            [
                tensors[name].reshape(-1).view(torch.uint8)
                for name, _, _ in self.schedule.misc_layout
            ]
        )

    def _unpack_misc(self, payload: torch.Tensor, tensors: Mapping[str, torch.Tensor]) -> None:
        for name, offset, size in self.schedule.misc_layout:
            tensors[name].reshape(-1).view(torch.uint8).copy_(payload[offset : offset + size])

    # -- failure -----------------------------------------------------------------------------

    def _fail(self, t: int, reason: str, *, store: bool = True) -> None:
        """Leave the notice, find the dead, close the world, raise :class:`RefitFailed`.

        ``store=False``: the coordinator's verdict ended the world (every member hears it), so
        the store, which may have died with its host, is not asked. A store found unreachable
        here waits up to :data:`VERDICT_WAIT_S` for that verdict, which names who died."""
        dead: tuple[Peer, ...] = ()
        verdict = None if self._verdict is None else self._verdict()
        if store and verdict is None:
            try:
                self._store.set(f"t{t}/alive/{self.rank}", "1")
                if self._store.add(f"t{t}/failed", 1) == 1:
                    self._store.set(f"t{t}/failure", f"{self.peer}: {reason}")
            except RuntimeError as e:
                reason += f" (and the store at {self.bootstrap.store} is unreachable: {e})"
                verdict = self._await_verdict()  # the store's host may be who died
            else:
                dead = self._find_dead(t)
        if verdict is not None:  # every member hears it: no notice, no counters
            dead, reason = verdict.dead, f"{reason}; {verdict.reason}"
        self._failed = True
        self._close_quietly()
        raise RefitFailed(t, dead, reason)

    def _await_verdict(self) -> Verdict | None:
        """The coordinator's verdict on this world's epoch, waited for up to
        :data:`VERDICT_WAIT_S`: the store is gone, and only the coordinator can say who died
        (None: no verdict came)."""
        if self._verdict is None:
            return None
        until = time.monotonic() + VERDICT_WAIT_S
        while (verdict := self._verdict()) is None and time.monotonic() < until:
            time.sleep(self._heartbeat_s)
        return verdict

    def _find_dead(self, t: int) -> tuple[Peer, ...]:
        """The members whose liveness counter did not move over three heartbeats, less those
        that said they saw the failure themselves (they stop their counter when they close)."""
        others = [r for r in range(self.world_size) if r != self.rank]
        keys = [f"hb/{r}" for r in others]
        try:
            before = self._store.multi_get(keys)
            time.sleep(3 * self._heartbeat_s)
            after = self._store.multi_get(keys)
            stalled = [r for r, a, b in zip(others, before, after, strict=True) if a == b]
            told = [r for r in stalled if self._store.check([f"t{t}/alive/{r}"])]
        except RuntimeError:
            return ()
        return tuple(self._peer(r) for r in stalled if r not in told)

    def close(self) -> None:
        """Stop using the world; every later call raises :class:`RefitClosed`."""
        self._close_quietly()

    def _close_quietly(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._liveness.stop()
        if self._failed:
            # an operation may be stuck on a dead peer: release in the reaper thread
            for backend in self._backends:
                self._kind.abandon(backend)
        self._backends.clear()  # nothing in flight: the destructors run now, and end at once

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> RefitWorld:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Watch:
    """A transfer's look at the rest of the world: the coordinator's verdict and the deadline
    at every look; at most once per heartbeat, a failure notice and a stalled liveness counter."""

    def __init__(self, world: RefitWorld, t: int) -> None:
        self._world = world
        self._t = t
        self._next = 0.0
        self._seen: dict[int, tuple[bytes, float]] = {}

    def look(self, deadline: float, doing: str) -> None:
        w = self._world
        # First the coordinator's verdict, read from what the agent already heard (no request):
        # it covers the store's host, whose death leaves the store below unreadable.
        if w._verdict is not None and w._verdict() is not None:
            w._fail(self._t, f"the world's epoch ended ({doing})", store=False)
        now = time.monotonic()
        if now > deadline:
            w._fail(self._t, f"timed out after {w._timeout_s} s ({doing})")
        if now < self._next:
            return
        self._next = now + w._heartbeat_s
        if w._store.add(f"t{self._t}/failed", 0) > 0:
            notice = w._store.get(f"t{self._t}/failure").decode(errors="replace")
            w._fail(self._t, f"a member failed first: {notice}")
        others = [r for r in range(w.world_size) if r != w.rank]
        counts = w._store.multi_get([f"hb/{r}" for r in others])
        stalled = []
        for r, c in zip(others, counts, strict=True):
            last = self._seen.get(r)
            if last is None or last[0] != c:
                self._seen[r] = (c, now)
            elif now - last[1] > w._stall_s:
                stalled.append(w._peer(r))
        if stalled:
            w._fail(
                self._t,
                f"the liveness counter of {', '.join(map(str, stalled))} stalled for "
                f"{w._stall_s} s ({doing})",
            )


def _gloo_hostname(store_host: str) -> str | None:
    """The address gloo binds to: loopback when the store is on loopback, else the default."""
    return store_host if store_host in ("127.0.0.1", "localhost", "::1") else None


def open_world(
    plan: ReshardPlan,
    side: Side,
    slot: int,
    bootstrap: Bootstrap | Mapping[str, Any],
    lanes: int,
    *,
    timeout_s: float = 30.0,
    heartbeat_s: float = 0.1,
    stall_s: float = 2.0,
    gloo_hostname: str | None = None,
    device: torch.device | str | None = None,
    verdict: Callable[[], Verdict | None] | None = None,
) -> RefitWorld:
    """Join the refit world of ``bootstrap`` as ``side`` slot ``slot`` and connect its lanes.

    Blocks until every member has joined (or raises :class:`RefitFailed` naming those that did
    not within ``timeout_s``). ``timeout_s`` bounds formation and each transfer; ``stall_s`` is
    how long a member's liveness counter may stand still before the member is taken for dead.
    ``device``: the GPU of a NCCL world (default ``cuda:LOCAL_RANK``, as the data plane's).
    ``verdict``: the coordinator's word on the world's epoch, read at every look of a transfer:
    None while the epoch stands, else a :class:`Verdict` (why it ended, and who died, if a
    member did; ``RefitClient.verdict(admitted)``). Without it the death of the store's host
    (publisher slot 0) is seen only when the store fails, and names no one.
    """
    if side not in SIDES:
        raise RefitError(f"side must be one of {SIDES}, got {side!r}")
    size = plan.layout(side).mesh.size
    if type(slot) is not int or not 0 <= slot < size:
        raise RefitError(f"{side} slot must be in 0..{size - 1}, got {slot!r}")
    if not 0 < timeout_s <= 3600 or not 0 < heartbeat_s < stall_s:
        raise RefitError(
            f"need 0 < timeout_s <= 3600 and 0 < heartbeat_s < stall_s, got timeout_s="
            f"{timeout_s}, heartbeat_s={heartbeat_s}, stall_s={stall_s}"
        )
    if not isinstance(bootstrap, Bootstrap):
        bootstrap = decode_bootstrap(bootstrap)
    return RefitWorld(
        plan,
        side,
        slot,
        bootstrap,
        lanes,
        timeout_s,
        heartbeat_s,
        stall_s,
        gloo_hostname,
        device,
        verdict,
    )
