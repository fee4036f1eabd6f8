"""The interface every store implements, and the rules they share.

A ``Log`` is bound to the event loop that opened it: call its coroutines from that loop only
(they are not thread-safe; the stores keep their own threads and connections inside). What is
common to the stores lives here: validation before anything is written, the meaning of
``after`` (exclusive) and ``until`` (inclusive), and how waiters are woken.

Wake-ups: a commit made by this ``Log`` wakes its waiters directly (no polling). Commits made by
other processes are noticed by a store-specific watcher (``_poll_head``) that runs only while
somebody waits: SQLite polls ``PRAGMA data_version``; PostgreSQL listens for NOTIFY and polls
as a safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Collection, Iterable, Sequence

import msgspec

from .errors import ChecksumError, LogClosed
from .projection import ProjectionRow, encode_projection
from .record import (
    KINDS,
    MAX_PAYLOAD_BYTES,
    Encoded,
    InvalidRecord,
    NewRecord,
    Record,
    check_kinds,
    validate,
    validate_fields,
)

#: One validated record on its way to storage: (ts_ns, kind, group, rank, encoded payload).
Row = tuple[int, str, str | None, int | None, bytes]

#: What a store gives back for an append: the offsets the rows got and the checksum each one
#: was stored with (the writer computes them while building the frames).
Sealed = tuple[list[int], list[int]]


def prepare(records: Sequence[NewRecord | Encoded], kinds: frozenset[str] = KINDS) -> list[Row]:
    """Validate a whole batch before anything is written; stamp ``ts`` where the caller left it out.

    An :class:`Encoded` record brings its payload already encoded; its other fields are checked
    all the same. The error names the index of the first bad record, so a caller can find it in
    its batch.
    """
    if isinstance(records, NewRecord | Encoded):
        raise InvalidRecord("append takes a sequence of NewRecord, got a single NewRecord")
    now = time.time_ns()
    rows: list[Row] = []
    for i, rec in enumerate(records):
        try:
            if type(rec) is Encoded:
                payload = rec.payload
                rec = rec.record
                if type(payload) is not bytes or len(payload) > MAX_PAYLOAD_BYTES:
                    raise InvalidRecord("an Encoded payload must be validate()'s bytes")
                if not isinstance(rec, NewRecord):
                    raise InvalidRecord(f"expected a NewRecord, got {type(rec).__name__}")
                validate_fields(rec, kinds)
            elif isinstance(rec, NewRecord):
                payload = validate(rec, kinds)
            else:
                raise InvalidRecord(f"expected a NewRecord, got {type(rec).__name__}")
        except InvalidRecord as exc:
            raise InvalidRecord(f"record {i}: {exc}") from None
        rows.append((now if rec.ts is None else rec.ts, rec.kind, rec.group, rec.rank, payload))
    return rows


def _check_offset(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer offset, got {value!r}")
    return value


def _check_filtered(records: list[Record], group: str | None, kinds: list[str] | None) -> None:
    """A filtered read selects rows by their ``grp`` and ``kind`` columns; the record itself
    comes from the checksummed frame. Refuse a row whose columns and frame disagree."""
    for rec in records:
        if (group is not None and rec.group != group) or (
            kinds is not None and rec.kind not in kinds
        ):
            raise ChecksumError(
                rec.offset,
                f"its columns place it in group {group!r}, kinds {kinds}, but it holds "
                f"group {rec.group!r}, kind {rec.kind!r}",
            )


class RemovedRange(msgspec.Struct, frozen=True):
    """Records removed by one compaction step: ``removed`` records with offsets from ``first``
    to ``last`` (both removed). The records of that span that were kept are still in the log;
    every offset in it that a reader does not find is one of the ``removed``."""

    first: int
    last: int
    removed: int


def _check_removal(offset: int, remove: Sequence[int]) -> list[int]:
    """The offsets a compaction step removes: strictly increasing, each in ``1..offset``."""
    out: list[int] = []
    prev = 0
    for i, o in enumerate(remove):
        if isinstance(o, bool) or not isinstance(o, int) or o <= prev:
            raise ValueError(
                f"offsets to remove must be strictly increasing positive integers; item {i} is "
                f"{o!r} after {prev}"
            )
        prev = o
        out.append(o)
    if out and out[-1] > offset:
        raise ValueError(
            f"offset {out[-1]} lies after the kept snapshot at offset {offset}: only records "
            "behind a kept snapshot may be removed"
        )
    return out


def check_compaction(
    where: str, name: str, offset: int, remove: list[int], head: int, kept: int, removed_to: int
) -> None:
    """The store-side rules of :meth:`Log.compact`, checked inside its transaction."""
    if offset > head:
        raise ValueError(
            f"cannot keep a snapshot at offset {offset} of {where}: its head is {head}"
        )
    if offset <= kept:
        raise ValueError(
            f"{where} already keeps snapshot {name!r} at offset {kept}; a compaction step must "
            f"end after it, not at {offset}"
        )
    floor = max(kept, removed_to)
    if remove and remove[0] <= floor:
        raise ValueError(
            f"offset {remove[0]} of {where} lies at or before offset {floor} (the last kept "
            f"snapshot {name!r} or removed range): a step removes only records after both"
        )


def missing_offsets(where: str, remove: list[int], gone: int) -> str:
    return (
        f"{len(remove) - gone} of the {len(remove)} offsets to remove from {where} "
        f"({remove[0]}..{remove[-1]}) are not in the log; nothing was removed"
    )


class Log(ABC):
    """A durable, append-only log of records with gap-free offsets (see ``docs/eventlog.md``)."""

    #: How often a waiter checks for appends made by other processes, in seconds.
    poll_interval: float = 0.05
    #: The record kinds this log accepts: membership's, unless whoever composes the facets
    #: hands it theirs beside them (:meth:`accept`).
    kinds: frozenset[str] = KINDS

    def __init__(self, where: str, term: int, head: int) -> None:
        self.where = where
        self._term = term
        self._known_head = head
        self._closed = False
        self._wakeups: list[asyncio.Future[None]] = []
        self._waiting = 0
        self._watch: asyncio.Task[None] | None = None
        self._commits = 0

    # -- the interface ---------------------------------------------------------------------

    def accept(self, kinds: Iterable[str]) -> None:
        """Accept ``kinds`` (each a name of ``[a-z_]``) beside membership's: this log's kinds
        are its opener's to name (the coordinator's facets), never the process's."""
        self.kinds = KINDS | check_kinds(kinds)

    @property
    def term(self) -> int:
        """The term this Log appends under; appends fail with StaleTermError once it is stale."""
        return self._term

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def commits(self) -> int:
        """How many append transactions this Log committed (group commit makes it < appends)."""
        return self._commits

    async def append(self, records: Sequence[NewRecord | Encoded]) -> list[int]:
        """Append a batch atomically; return its offsets once the commit is durable.

        Every record is validated first; one bad record refuses the whole batch and nothing is
        written. Concurrent callers share commits. If the caller is cancelled after the batch
        was handed to the store, the batch may still be committed.
        """
        offsets, _ = await self.append_sealed(records)
        return offsets

    async def append_sealed(self, records: Sequence[NewRecord | Encoded]) -> Sealed:
        """:meth:`append`, also handing back each record's checksum as stored: a caller that
        builds the durable records itself (the coordinator's host, which folds what it just
        appended without reading it back) need not compute them again."""
        self._check_open()
        rows = prepare(records, self.kinds)
        if not rows:
            return [], []
        return await self._append_rows(rows)

    async def read(
        self,
        after: int = 0,
        limit: int = 1000,
        *,
        group: str | None = None,
        kinds: Collection[str] | None = None,
        until: int | None = None,
    ) -> list[Record]:
        """Records with ``after < offset <= until``, ascending, at most ``limit``, checksums verified."""
        self._check_open()
        _check_offset("after", after)
        if until is not None:
            _check_offset("until", until)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        if isinstance(kinds, str):
            raise ValueError(f"kinds must be a collection of kinds, got the string {kinds!r}")
        kind_list = None if kinds is None else sorted(set(kinds))
        if kind_list == [] or (until is not None and until <= after):
            return []
        try:
            records = await self._read(after, limit, group, kind_list, until)
        except Exception:
            self._check_open()  # a query cut short by close() is LogClosed, not a storage error
            raise
        if group is not None or kind_list is not None:
            _check_filtered(records, group, kind_list)
        return records

    async def tail(
        self,
        after: int = 0,
        *,
        group: str | None = None,
        kinds: Collection[str] | None = None,
        batch: int = 1000,
    ) -> AsyncIterator[Record]:
        """Yield every record after ``after``, forever; ends when the log is closed.

        Each pass reads up to a head taken first, so when a filter hides records the tail still
        knows how far it has looked, and then waits for the head to move past that point.
        """
        position = _check_offset("after", after)
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive integer, got {batch!r}")
        while not self._closed:
            try:
                head = await self.head()
                while position < head:
                    page = await self.read(position, batch, group=group, kinds=kinds, until=head)
                    for rec in page:
                        yield rec
                    position = page[-1].offset if len(page) == batch else head
                await self.wait(position)
            except LogClosed:
                return

    async def wait(self, after: int, timeout: float | None = None) -> int:
        """Return the head as soon as it is past ``after``, or the current head at the timeout."""
        self._check_open()
        _check_offset("after", after)
        head = await self.head()
        if head > after:
            return head
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        self._waiting += 1
        try:
            self._ensure_watch()
            while self._known_head <= after:
                self._check_open()  # close() may have run while head() was in flight
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                wakeup: asyncio.Future[None] = loop.create_future()
                self._wakeups.append(wakeup)
                try:
                    async with asyncio.timeout(remaining):
                        await wakeup
                except TimeoutError:
                    with contextlib.suppress(ValueError):  # already taken by _wake_all
                        self._wakeups.remove(wakeup)
                self._check_open()
        finally:
            self._waiting -= 1
        return self._known_head

    async def head(self) -> int:
        """The last durable offset (0 when empty), including appends by other processes."""
        self._check_open()
        try:
            head = await self._read_head()
        except Exception:
            self._check_open()  # a query cut short by close() is LogClosed, not a storage error
            raise
        self._advance(head)
        return self._known_head

    async def claim_term(self) -> int:
        """Take the log over: bump the head row's term and append under it from now on.

        Any other writer still holding the old term gets StaleTermError on its next append.
        """
        self._check_open()
        self._term = await self._claim_term()
        return self._term

    async def get_consumer_offset(self, name: str) -> int:
        """The last offset consumer ``name`` processed (0 if it never stored one)."""
        self._check_open()
        return await self._get_consumer_offset(_check_consumer(name))

    async def set_consumer_offset(self, name: str, offset: int) -> None:
        """Store the consumer's last processed offset; a lower value than stored is refused."""
        self._check_open()
        await self._set_consumer_offset(_check_consumer(name), _check_offset("offset", offset))

    async def write_projections(
        self, rows: Sequence[ProjectionRow], *, consumer: str, offset: int, durable: bool = True
    ) -> None:
        """Upsert rows by ``(kind, group, seq)`` and set ``consumer``'s offset, in one transaction.

        ``durable=False``: on SQLite the transaction is committed without syncing the WAL. It is
        visible at once and survives a crash of the process; only a crash of the machine, which
        takes every coordinator on that file with it, may undo it, rows and offset together,
        until the next durable commit syncs the WAL behind it. For a consumer that derives its
        rows again from the log after the offset it finds stored, as the coordinator does at
        start. PostgreSQL always commits durably: coordinators outlive a crash of the server,
        which could undo a commit made without a sync after a standby had seen it."""
        self._check_open()
        encoded = [(r.kind, r.group, r.seq, encode_projection(i, r)) for i, r in enumerate(rows)]
        await self._write_projections(
            encoded, _check_consumer(consumer), _check_offset("offset", offset), bool(durable)
        )

    async def read_projections(
        self, kind: str, group: str | None = None, *, after_seq: int = 0, limit: int = 1000
    ) -> list[ProjectionRow]:
        """Rows of ``kind`` (in ``group`` if given) with ``seq > after_seq``, by (group, seq)."""
        self._check_open()
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be a positive integer, got {limit!r}")
        return await self._read_projections(
            kind, group, _check_offset("after_seq", after_seq), limit
        )

    async def get_projection(self, kind: str, group: str, seq: int) -> ProjectionRow | None:
        self._check_open()
        return await self._get_projection(kind, group, seq)

    async def save_snapshot(self, name: str, offset: int, data: bytes) -> None:
        """Keep ``data`` as the latest snapshot called ``name``, taken at ``offset``."""
        self._check_open()
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"snapshot data must be bytes, got {type(data).__name__}")
        await self._save_snapshot(
            _check_consumer(name), _check_offset("offset", offset), bytes(data)
        )

    async def load_snapshot(self, name: str) -> tuple[int, bytes] | None:
        """The latest snapshot called ``name`` as ``(offset, data)``, or None."""
        self._check_open()
        return await self._load_snapshot(name)

    # -- retention (docs/eventlog.md, "Retention") --------------------------------------------

    async def compact(
        self,
        name: str,
        offset: int,
        data: bytes,
        remove: Sequence[int],
        *,
        previous: bytes | None = None,
    ) -> RemovedRange | None:
        """One compaction step, in ONE transaction: keep ``data`` as snapshot ``name`` at
        ``offset`` for the life of the log, delete the records at the offsets in ``remove``
        (strictly increasing), and record what was removed as a :class:`RemovedRange` (None
        when ``remove`` is empty). With ``previous``, the data of the snapshot ``name`` kept
        before this one becomes ``previous``: a caller keeps a short summary of a snapshot the
        new one supersedes, so kept snapshots do not add a whole state to the log per step.

        Refused with ValueError, nothing changed, unless: ``offset`` is at most the head and
        after every snapshot ``name`` kept before; every offset removed lies after that
        previous kept snapshot and after every range removed before, at most at ``offset``,
        and is in the log. So records are only ever removed behind a kept snapshot, from
        which a fold of what remains can start, and a crash leaves either the whole step or
        none of it.
        """
        self._check_open()
        name = _check_consumer(name)
        _check_offset("offset", offset)
        if offset < 1:
            raise ValueError("a kept snapshot's offset must be at least 1")
        if not isinstance(data, bytes | bytearray | memoryview):
            raise TypeError(f"snapshot data must be bytes, got {type(data).__name__}")
        offsets = _check_removal(offset, remove)
        if previous is not None and not isinstance(previous, bytes | bytearray | memoryview):
            raise TypeError(f"previous must be bytes, got {type(previous).__name__}")
        return await self._compact(
            name, offset, bytes(data), offsets, None if previous is None else bytes(previous)
        )

    async def removed_ranges(self, after: int = 0, until: int | None = None) -> list[RemovedRange]:
        """The removed ranges that reach past ``after`` and start at or before ``until``, by
        offset: what a reader of ``read(after, until=until)`` should know is missing."""
        self._check_open()
        _check_offset("after", after)
        if until is not None:
            _check_offset("until", until)
            if until <= after:
                return []
        return await self._removed_ranges(after, until)

    async def kept_snapshots(self, name: str) -> list[int]:
        """The offsets of the snapshots called ``name`` that compaction keeps, ascending."""
        self._check_open()
        return await self._kept_snapshots(_check_consumer(name))

    async def load_kept_snapshot(self, name: str, offset: int) -> bytes | None:
        """The kept snapshot ``name`` at ``offset``, or None."""
        self._check_open()
        return await self._load_kept_snapshot(
            _check_consumer(name), _check_offset("offset", offset)
        )

    async def stored_bytes(self) -> int:
        """How many bytes the store holds in use: a SQLite file's pages less its free list
        (removed records' pages are reused by later appends), PostgreSQL's tables and indexes
        of the log's schema."""
        self._check_open()
        return await self._stored_bytes()

    async def close(self) -> None:
        """Stop the store; waiters and tails end, later calls raise LogClosed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._wake_all()
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
        await self._close()

    async def __aenter__(self) -> Log:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- shared machinery -------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogClosed(f"{self.where} is closed")

    def _committed(self, head: int) -> None:
        """A store calls this on the loop after each durable append transaction."""
        self._commits += 1
        self._advance(head)

    def _advance(self, head: int) -> None:
        """Record that the head reached ``head``; wake every waiter if it moved."""
        if head > self._known_head:
            self._known_head = head
            self._wake_all()

    def _wake_all(self) -> None:
        wakeups, self._wakeups = self._wakeups, []
        for w in wakeups:
            if not w.done():
                w.set_result(None)

    def _ensure_watch(self) -> None:
        if self._watch is None or self._watch.done():
            self._watch = asyncio.get_running_loop().create_task(self._watch_others())

    async def _watch_others(self) -> None:
        """While somebody waits, look for commits made by other processes."""
        while self._waiting > 0 and not self._closed:
            await asyncio.sleep(self.poll_interval)
            if self._waiting > 0 and not self._closed:
                head = await self._poll_head()
                if head is not None:
                    self._advance(head)

    # -- what a store provides ---------------------------------------------------------------

    @abstractmethod
    def _append_rows(self, rows: list[Row]) -> Awaitable[Sealed]:
        """Make ``rows`` durable in one atomic append; the awaitable gives their offsets and
        checksums."""

    @abstractmethod
    async def _read(
        self,
        after: int,
        limit: int,
        group: str | None,
        kinds: list[str] | None,
        until: int | None,
    ) -> list[Record]: ...

    @abstractmethod
    async def _read_head(self) -> int: ...

    @abstractmethod
    async def _poll_head(self) -> int | None:
        """A cheap check for other writers: the new head, or None if nothing changed."""

    @abstractmethod
    async def _claim_term(self) -> int: ...

    @abstractmethod
    async def _get_consumer_offset(self, name: str) -> int: ...

    @abstractmethod
    async def _set_consumer_offset(self, name: str, offset: int) -> None: ...

    @abstractmethod
    async def _write_projections(
        self, rows: list[tuple[str, str, int, bytes]], consumer: str, offset: int, durable: bool
    ) -> None: ...

    @abstractmethod
    async def _read_projections(
        self, kind: str, group: str | None, after_seq: int, limit: int
    ) -> list[ProjectionRow]: ...

    @abstractmethod
    async def _get_projection(self, kind: str, group: str, seq: int) -> ProjectionRow | None: ...

    @abstractmethod
    async def _save_snapshot(self, name: str, offset: int, data: bytes) -> None: ...

    @abstractmethod
    async def _load_snapshot(self, name: str) -> tuple[int, bytes] | None: ...

    @abstractmethod
    async def _compact(
        self, name: str, offset: int, data: bytes, remove: list[int], previous: bytes | None
    ) -> RemovedRange | None: ...

    @abstractmethod
    async def _removed_ranges(self, after: int, until: int | None) -> list[RemovedRange]: ...

    @abstractmethod
    async def _kept_snapshots(self, name: str) -> list[int]: ...

    @abstractmethod
    async def _load_kept_snapshot(self, name: str, offset: int) -> bytes | None: ...

    @abstractmethod
    async def _stored_bytes(self) -> int: ...

    @abstractmethod
    async def _close(self) -> None: ...


def _check_consumer(name: object) -> str:
    if not isinstance(name, str) or not name or len(name) > 200:
        raise ValueError(
            f"a consumer or snapshot name must be a non-empty string of at most 200 characters, got {name!r}"
        )
    return name
