"""The leader lease: which coordinator leads a shared log, and until when.

One row (``id = 1``). ``generation`` goes up by one with every successful claim, so a lease
holder renews only its own generation; ``holder_pid`` is the PostgreSQL backend of the holder's
lease connection, so a crashed holder (its session gone) can be replaced before the lease runs
out; ``expires_at`` is on the database's clock (``now()``), the one clock every coordinator
shares. ``term`` and ``address`` are what the holder tells others: the log term it appends
under and the URL clients should use. See docs/ha.md.

The table exists on SQLite too, so both stores share one schema, but only the PostgreSQL
coordinators use it (a SQLite log has one coordinator).

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "leader_lease",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.Text(), nullable=True),
        sa.Column("address", sa.Text(), nullable=True),
        sa.Column("term", sa.BigInteger(), nullable=True),
        sa.Column("holder_pid", sa.Integer(), nullable=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("id = 1", name="leader_lease_single_row"),
    )
    op.execute("INSERT INTO leader_lease (id, generation) VALUES (1, 0)")


def downgrade() -> None:
    op.drop_table("leader_lease")
