"""Leader election for coordinators that share one PostgreSQL log: a lease row on the DB's clock.

The row ``leader_lease`` (migration 0003) says who leads and until when. Rules, and why:

- **One atomic claim.** A coordinator becomes leader only through one ``UPDATE`` that bumps
  ``generation`` and succeeds only while the lease is free: it ran out (``expires_at <= now()``),
  it was released, or its holder's database session is gone. The row lock serializes claimants
  and PostgreSQL re-checks the condition on the row the winner wrote, so of two coordinators
  that claim at once exactly one wins.
- **The database's clock.** ``expires_at`` is ``now() + lease`` on the server, so coordinators
  never compare their own clocks. The holder renews every ``lease / 4``, only for its own
  generation; a renewal that finds another generation means the lease was lost.
- **A crash is seen at once, a pause by the lease.** ``holder_pid`` is the backend of the
  holder's lease connection. When the holder's process dies the kernel closes that connection
  and the backend exits, so a standby may claim at its next poll instead of waiting for the
  lease to run out. A paused holder (SIGSTOP, a long GC pause) keeps its session open, so only
  the lease's expiry frees it: an advisory lock alone could not detect that.
- **The lease is for liveness, the term for safety.** Winning the lease only allows the winner
  to call ``Log.claim_term()``. Fencing comes from the log: every append checks the term in
  ``log_head``, so a deposed leader that still believes it leads writes nothing.

The lease has its own connection (its backend pid is the liveness marker) and every statement
has a timeout, so a slow database shows up as a failed renewal, never as a hung loop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import asyncpg

from ...eventlog.failpoints import stop_point
from ...eventlog.target import PostgresTarget

_CLAIM = """
WITH claimed AS (
    UPDATE leader_lease
    SET generation = generation + 1, holder = $1, address = $2, term = NULL,
        holder_pid = pg_backend_pid(), expires_at = now() + make_interval(secs => $3)
    WHERE id = 1 AND (
        expires_at IS NULL
        OR expires_at <= now()
        OR holder_pid IS NULL
        OR NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = leader_lease.holder_pid)
    )
    RETURNING generation
)
SELECT (SELECT generation FROM claimed) AS won, generation, holder, address, term,
       coalesce(expires_at > now(), false) AS live
FROM leader_lease WHERE id = 1
"""

_RENEW = """
UPDATE leader_lease
SET expires_at = now() + make_interval(secs => $3), holder_pid = pg_backend_pid(),
    term = coalesce($4, term)
WHERE id = 1 AND holder = $1 AND generation = $2
RETURNING generation
"""

_RELEASE = """
UPDATE leader_lease SET expires_at = NULL, holder_pid = NULL
WHERE id = 1 AND holder = $1 AND generation = $2
"""


class LeaseError(Exception):
    """The lease row could not be read or written (the database is unreachable or slow)."""


@dataclass(frozen=True, slots=True)
class LeaseSettings:
    """How long a lease lasts and how often standbys look at it.

    A dead leader is replaced within about ``poll_s`` (its session is gone) and a frozen one
    within ``lease_s + poll_s``. A shorter lease fails over sooner but deposes a leader whose
    renewals stall that long (a GC pause, a slow database); docs/ha.md has the trade-off.
    """

    lease_s: float = 1.0
    poll_s: float = 0.1

    def __post_init__(self) -> None:
        for name in ("lease_s", "poll_s"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if self.poll_s >= self.lease_s:
            raise ValueError(
                f"poll_s ({self.poll_s} s) must be shorter than lease_s ({self.lease_s} s), "
                "or standbys would notice an expired lease later than a lease lasts"
            )

    @property
    def renew_s(self) -> float:
        """The leader renews four times per lease, so three renewals in a row may fail."""
        return self.lease_s / 4

    @property
    def statement_timeout_s(self) -> float:
        """A lease statement slower than one lease counts as failed. A slow renewal that does
        complete is still valid (the row names its generation), so there is no point giving
        up on it sooner."""
        return self.lease_s


@dataclass(frozen=True, slots=True)
class LeaseState:
    """The lease row as one claim attempt saw it.

    ``won`` is the generation this attempt won, or None. Otherwise ``holder``, ``address`` and
    ``term`` describe the current holder, and ``live`` says whether its lease is still running.
    """

    won: int | None
    generation: int
    holder: str | None
    address: str | None
    term: int | None
    live: bool

    @property
    def leader(self) -> str | None:
        """The address of the coordinator that leads now, if any."""
        return self.address if self.live and self.won is None else None


class Lease:
    """One coordinator's side of the lease: claim, confirm, renew, release.

    ``holder`` must be unique per process (a restarted process is a new holder, so it never
    renews the lease of its previous life); ``address`` is the URL advertised to clients.
    """

    def __init__(
        self, target: PostgresTarget, holder: str, address: str, settings: LeaseSettings
    ) -> None:
        self.target = target
        self.holder = holder
        self.address = address
        self.settings = settings
        self._conn: asyncpg.Connection | None = None

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            server_settings = {"application_name": f"foldplane-lease {self.address}"[:63]}
            if self.target.schema:
                server_settings["search_path"] = self.target.schema
            try:
                self._conn = await asyncpg.connect(
                    self.target.dsn,
                    server_settings=server_settings,
                    timeout=max(self.settings.lease_s, 1.0),
                )
            except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
                raise LeaseError(f"cannot connect to {self.target.describe()}: {exc}") from exc
        return self._conn

    async def _fetchrow(self, sql: str, *args: object) -> asyncpg.Record | None:
        conn = await self._connection()
        try:
            return await conn.fetchrow(sql, *args, timeout=self.settings.statement_timeout_s)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if not isinstance(exc, asyncpg.PostgresError):
                # The connection's state is unknown after a timeout or a broken socket.
                await self._drop()
            raise LeaseError(
                f"lease statement on {self.target.describe()} failed: {type(exc).__name__}: {exc}"
            ) from exc

    async def try_claim(self) -> LeaseState:
        """Claim the lease if it is free; either way, say who holds it now."""
        row = await self._fetchrow(_CLAIM, self.holder, self.address, self.settings.lease_s)
        if row is None:
            raise LeaseError(
                f"{self.target.describe()} has no leader_lease row; is the schema at revision 0003?"
            )
        return LeaseState(
            won=row["won"],
            generation=row["won"] if row["won"] is not None else row["generation"],
            holder=self.holder if row["won"] is not None else row["holder"],
            address=self.address if row["won"] is not None else row["address"],
            term=None if row["won"] is not None else row["term"],
            live=True if row["won"] is not None else row["live"],
        )

    async def renew(self, generation: int, term: int | None = None) -> bool:
        """Extend the lease of ``generation`` (recording ``term`` if given); False if lost."""
        stop_point("renew")
        row = await self._fetchrow(_RENEW, self.holder, generation, self.settings.lease_s, term)
        return row is not None

    async def release(self, generation: int) -> None:
        """Give the lease up at once, so a standby need not wait for it to run out."""
        conn = await self._connection()
        try:
            await conn.execute(
                _RELEASE, self.holder, generation, timeout=self.settings.statement_timeout_s
            )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            raise LeaseError(f"releasing the lease failed: {exc}") from exc

    async def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            try:
                await conn.close(timeout=1.0)
            except Exception:
                conn.terminate()
