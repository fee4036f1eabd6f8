"""Healing a rank's state from its peers' threads: the last committed step, tensor by tensor.

Every member of an elastic DDP runs a ``HealServer``: a thread that answers, at any moment and
without the training thread's help, with the state of the member's last committed step. A rank
behind (a replacement) pulls that state from several members at once, straight into its own
parameter and optimizer tensors; nothing is flattened or serialised on either side, only the
state's structure (a small header).

The rules:

- **What is served is exactly the last committed step's state.** The training thread changes
  the state only between ``StateGate.begin_mutation`` and ``end_mutation`` (the optimizer step of
  a committed step, a heal that loads state). A pull pins the state between two mutations (a
  ``Session`` at ``steps`` committed steps); when a mutation begins while a session still has
  bytes to send, the gate first copies every tensor the session has yet to send (copy-on-write),
  and the session goes on from the copies. So the member keeps stepping while it serves, and
  the bytes that leave are the pinned step's, bit for bit. Buffers, which a forward pass changes
  outside the gate, are served from a copy taken at the end of each mutation.
- **A reader never holds the training thread for long.** Live memory is sent in chunks of
  ``CHUNK_BYTES`` under the gate's lock, each with a send timeout of ``LIVE_SEND_TIMEOUT_S``; a
  mutation waits for at most one chunk. A copy is sent without the lock.
- **The split is deterministic.** The state's bytes, tensor after tensor, are cut into as many
  equal pieces as there are sources (sorted by rank), a piece a run of byte ranges of tensors.
  A source that fails mid-pull hands what it had left to the other sources, split again; if
  none is left, or none still holds the pinned step, the pull raises ``HealError`` saying how
  far it got.

The wire format (a ``pin`` request, then ``get`` requests, one TCP connection per source) is
declared in ``wire.heal``.
"""

from __future__ import annotations

import contextlib
import ctypes
import io
import logging
import math
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..wire.heal import (
    LENGTH,
    OK,
    REFUSED,
    GetRequest,
    HealProtocolError,
    HealRequest,
    PinRequest,
    decode_request,
    encode_request,
)

log = logging.getLogger("foldplane.heal")

CHUNK_BYTES = 4 << 20
#: The longest a chunk of live memory may take to leave (a mutation waits for one chunk).
LIVE_SEND_TIMEOUT_S = 2.0
_SOCKET_BUFFER = 8 << 20

SLOT = "__foldplane_tensor__"


class HealError(RuntimeError):
    """A pull could not bring the whole state: the message says from whom and how far it got."""


# -- the state as a structure plus tensors --------------------------------------------------


def split_tensors(obj: Any) -> tuple[Any, list[torch.Tensor]]:
    """``obj`` with each tensor replaced by ``(SLOT, index)``, and the tensors in that order."""
    tensors: list[torch.Tensor] = []

    def walk(x: Any) -> Any:
        if isinstance(x, torch.Tensor):
            tensors.append(x.detach())
            return (SLOT, len(tensors) - 1)
        if isinstance(x, dict):
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return type(x)(walk(v) for v in x)
        return x

    return walk(obj), tensors


def join_tensors(obj: Any, tensors: Sequence[Any]) -> Any:
    if isinstance(obj, tuple) and len(obj) == 2 and obj[0] == SLOT:
        return tensors[obj[1]]
    if isinstance(obj, dict):
        return {k: join_tensors(v, tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(join_tensors(v, tensors) for v in obj)
    return obj


def nbytes(dtype: str, shape: Sequence[int]) -> int:
    return math.prod(shape) * getattr(torch, dtype).itemsize


def _memory(tensor: torch.Tensor) -> memoryview:
    """The bytes of a contiguous CPU tensor, without a copy."""
    size = tensor.numel() * tensor.element_size()
    if size == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * size).from_address(tensor.data_ptr())).cast("B")


def split_pieces(sizes: Sequence[int], parts: int) -> list[list[tuple[int, int, int]]]:
    """Cut the bytes of tensors of ``sizes`` (in order) into ``parts`` runs of equal length.

    Each run is a list of ``(tensor, start, end)`` byte ranges; the same sizes and parts give
    the same runs on every rank.
    """
    total = sum(sizes)
    bounds = [total * k // parts for k in range(parts + 1)]
    runs: list[list[tuple[int, int, int]]] = [[] for _ in range(parts)]
    offset = 0
    for index, size in enumerate(sizes):
        for k in range(parts):
            lo, hi = max(bounds[k], offset), min(bounds[k + 1], offset + size)
            if lo < hi:
                runs[k].append((index, lo - offset, hi - offset))
        offset += size
    return runs


# -- the member's side -----------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """The state a session pins: its structure and tensors, at ``steps`` committed steps."""

    steps: int
    skeleton: Any
    tensors: list[torch.Tensor]


class Session:
    """One pull's view of a member's state, pinned at ``steps``; copy-on-write (see the gate)."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.steps = snapshot.steps
        self.tensors = list(snapshot.tensors)
        self.private = [False] * len(self.tensors)  # True: a copy of the session's own
        for index, tensor in enumerate(self.tensors):
            if tensor.device.type != "cpu" or not tensor.is_contiguous():  # sent as bytes
                self.tensors[index] = tensor.detach().to("cpu", copy=True).contiguous()
                self.private[index] = True
        self.wanted: dict[int, int] = {}  # tensor -> the lowest byte still to be sent
        self.mutated = False  # the live state moved on since the pin
        layout = [(str(t.dtype).removeprefix("torch."), list(t.shape)) for t in self.tensors]
        buf = io.BytesIO()
        torch.save({"steps": self.steps, "skeleton": snapshot.skeleton, "layout": layout}, buf)
        self.header = buf.getvalue()


class StateGate:
    """The training thread's mutations of the state against the sessions that read it."""

    def __init__(self) -> None:
        self.lock = threading.Condition()
        self._mutating = False
        self._sessions: set[Session] = set()
        self.steps = 0  # committed steps of the live state

    def begin_mutation(self) -> None:
        """The state is about to change: give every open session a copy of what it still needs."""
        with self.lock:
            if self._mutating:
                return
            for session in self._sessions:
                session.mutated = True
                for index in session.wanted:
                    if not session.private[index]:
                        session.tensors[index] = session.tensors[index].clone()
                        session.private[index] = True
            self._mutating = True

    def end_mutation(self, steps: int) -> None:
        with self.lock:
            self.steps = steps
            self._mutating = False
            self.lock.notify_all()

    @property
    def mutating(self) -> bool:
        return self._mutating

    def pin(self, snapshot: Callable[[int], Snapshot], timeout_s: float) -> Session:
        """A session on the state between mutations (waits up to ``timeout_s`` for one to end)."""
        with self.lock:
            if not self.lock.wait_for(lambda: not self._mutating, timeout_s):
                raise HealError(f"the state was still changing after {timeout_s:.1f} s")
            session = Session(snapshot(self.steps))
            self._sessions.add(session)
            return session

    def claim(self, session: Session, pieces: Sequence[tuple[int, int, int]]) -> str | None:
        """Reserve ``pieces`` for sending; the reason if the session cannot send them any more."""
        with self.lock:
            for index, start, _end in pieces:
                if session.mutated and not session.private[index]:
                    return (
                        f"tensor {index} of step {session.steps} is gone: the state moved on "
                        f"to step {self.steps} before it was asked for"
                    )
                session.wanted[index] = min(session.wanted.get(index, start), start)
            return None

    def close(self, session: Session) -> None:
        with self.lock:
            self._sessions.discard(session)


class HealServer:
    """Serves ``snapshot()`` through ``gate`` to whoever connects (a thread per connection)."""

    def __init__(
        self, gate: StateGate, snapshot: Callable[[int], Snapshot], host: str, *, name: str
    ) -> None:
        self._gate = gate
        self._snapshot = snapshot
        self._listener = socket.create_server((host, 0))
        self.address = (host, self._listener.getsockname()[1])
        self._name = name
        self.pin_timeout_s = 30.0
        threading.Thread(target=self._accept, name=f"foldplane-heal-{name}", daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._serve, args=(conn,), name=f"foldplane-heal-{self._name}", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        session: Session | None = None
        _tune(conn)
        try:
            while True:
                request = _recv_request(conn)
                if request is None:
                    return
                if isinstance(request, PinRequest):
                    session = self._gate.pin(self._snapshot, self.pin_timeout_s)
                    _send_blob(conn, session.header)
                elif session is not None:
                    pieces = request.pieces
                    refused = self._gate.claim(session, pieces)
                    if refused is not None:
                        conn.sendall(REFUSED)
                        _send_blob(conn, refused.encode())
                        continue
                    conn.sendall(OK)
                    self._send_pieces(conn, session, pieces)
        except (OSError, HealError, HealProtocolError) as e:
            log.info("heal server %s: a pull ended early: %s", self._name, e)
        finally:
            if session is not None:
                self._gate.close(session)
            conn.close()

    def _send_pieces(
        self, conn: socket.socket, session: Session, pieces: Sequence[tuple[int, int, int]]
    ) -> None:
        gate = self._gate
        timeout = conn.gettimeout()
        for index, start, end in pieces:
            at = start
            while at < end:
                stop = min(end, at + CHUNK_BYTES)
                with gate.lock:
                    private = session.private[index]
                    tensor = session.tensors[index]
                    if not private:  # live memory: it may not change while it leaves
                        conn.settimeout(LIVE_SEND_TIMEOUT_S)
                        conn.sendall(_memory(tensor)[at:stop])
                        conn.settimeout(timeout)
                if private:
                    conn.sendall(_memory(tensor)[at:stop])
                at = stop
                with gate.lock:
                    session.wanted[index] = at
            with gate.lock:
                session.wanted.pop(index, None)


# -- the pulling side ------------------------------------------------------------------------


@dataclass(frozen=True)
class Source:
    rank: int
    host: str
    port: int


class SourceSession:
    """A connection to one source, pinned at ``steps``."""

    def __init__(self, source: Source, timeout_s: float) -> None:
        self.source = source
        self.sock = socket.create_connection((source.host, source.port), timeout=timeout_s)
        _tune(self.sock)
        _send_blob(self.sock, encode_request(PinRequest()))
        header = _recv_blob(self.sock)
        meta = torch.load(io.BytesIO(header), weights_only=True)
        self.steps: int = meta["steps"]
        self.skeleton = meta["skeleton"]
        self.layout: list[tuple[str, list[int]]] = [(d, list(s)) for d, s in meta["layout"]]

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()

    def pull(
        self,
        pieces: list[tuple[int, int, int]],
        targets: Sequence[memoryview],
        done: list[tuple[int, int, int]],
    ) -> None:
        """Receive ``pieces`` into ``targets``; ``done`` collects the byte ranges received."""
        _send_blob(self.sock, encode_request(GetRequest(pieces)))
        status = _recv_exact(self.sock, 1)
        if status != OK:
            raise HealError(f"rank {self.source.rank}: {_recv_blob(self.sock).decode()}")
        for index, start, end in pieces:
            view = targets[index]
            at = start
            while at < end:
                got = self.sock.recv_into(view[at:end])
                if got == 0:
                    raise HealError(f"rank {self.source.rank} closed the connection")
                at += got
            done.append((index, start, end))


@dataclass(frozen=True)
class PullReport:
    """What one pull brought: from whom, how much, how long, and who failed on the way."""

    steps: int
    sources: tuple[int, ...]
    bytes: int
    seconds: float
    failed: tuple[str, ...]
    finished_at: float  # time.time() when the state was installed


def pin_sources(sources: Sequence[Source], timeout_s: float) -> list[SourceSession]:
    """A session on each source that answers, in parallel (those that do not are left out)."""
    out: list[SourceSession | None] = [None] * len(sources)

    def open_one(k: int) -> None:
        try:
            out[k] = SourceSession(sources[k], timeout_s)
        except (OSError, HealError, RuntimeError) as e:
            log.info("heal: rank %d does not serve its state: %s", sources[k].rank, e)

    threads = [threading.Thread(target=open_one, args=(k,)) for k in range(len(sources))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [s for s in out if s is not None]


def pull_state(
    sessions: Sequence[SourceSession], targets: Sequence[torch.Tensor]
) -> tuple[float, tuple[str, ...]]:
    """Fill ``targets`` (contiguous CPU tensors laid out as the sessions' state) from
    ``sessions``, which all pinned the same step; (seconds, the failures survived).

    Each session gets an equal share of the bytes; a session that fails hands its remainder to
    the others. Raises ``HealError`` when nobody can send what is left.
    """
    t0 = time.perf_counter()
    views = [_memory(t) for t in targets]
    sizes = [len(v) for v in views]
    total = sum(sizes)
    alive = list(sessions)
    remaining = [
        list(run) for run in split_pieces(sizes, len(alive))
    ]  # the first round: one run each
    failures: list[str] = []
    while True:
        received: list[list[tuple[int, int, int]]] = [[] for _ in alive]
        errors: list[BaseException | None] = [None] * len(alive)
        threads = [
            threading.Thread(
                target=_pull_one,
                args=(alive[k], remaining[k], views, received[k], errors, k),
                name="foldplane-heal-pull",
            )
            for k in range(len(alive))
            if remaining[k]
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        left: list[tuple[int, int, int]] = []
        for k in range(len(alive)):
            if errors[k] is None:
                continue
            failures.append(f"rank {alive[k].source.rank}: {errors[k]}")
            finished = {piece for piece in received[k]}
            left += [p for p in remaining[k] if p not in finished]
            alive[k].close()
        alive = [s for k, s in enumerate(alive) if errors[k] is None]
        if not left:
            return time.perf_counter() - t0, tuple(failures)
        missing = sum(end - start for _, start, end in left)
        if not alive:
            raise HealError(
                f"{total - missing} of {total} bytes received; no source left: "
                + "; ".join(failures)
            )
        log.warning("heal: %s; %d bytes left to the others", failures[-1], missing)
        remaining = [[] for _ in alive]
        shares = split_pieces([end - start for _, start, end in left], len(alive))
        for k, share in enumerate(shares):
            for which, start, end in share:
                index, base, _ = left[which]
                remaining[k].append((index, base + start, base + end))


def _pull_one(
    session: SourceSession,
    pieces: list[tuple[int, int, int]],
    views: Sequence[memoryview],
    received: list[tuple[int, int, int]],
    errors: list[BaseException | None],
    k: int,
) -> None:
    try:
        session.pull(pieces, views, received)
    except (OSError, HealError) as e:
        errors[k] = e


# -- framing ---------------------------------------------------------------------------------


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, option, _SOCKET_BUFFER)


def _send_blob(sock: socket.socket, blob: bytes) -> None:
    sock.sendall(LENGTH.pack(len(blob)) + blob)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    at = 0
    while at < n:
        got = sock.recv_into(view[at:])
        if got == 0:
            raise HealError("the peer closed the connection")
        at += got
    return bytes(buf)


def _recv_blob(sock: socket.socket) -> bytes:
    (size,) = LENGTH.unpack(_recv_exact(sock, LENGTH.size))
    return _recv_exact(sock, size)


def _recv_request(sock: socket.socket) -> HealRequest | None:
    try:
        body = _recv_blob(sock)
    except HealError:
        return None  # the peer hung up between requests
    return decode_request(body)
