"""Retention: the ranges of records removed behind a kept snapshot, and the kept snapshots.

``removed_range`` holds one row per compaction step: the lowest and highest offset it removed
(``first_seq``, ``last_seq``) and how many records of that span it removed (``removed``); the
records it kept there are still in ``log``.
Offsets are never reused, so a reader that finds an offset missing finds it inside one of
these ranges, never a silent hole.

``kept_snapshot`` holds the snapshots compaction steps end at, for the life of the log: the
records a step removed lie behind its snapshot, so a fold of what remains starts from one of
them. (The ``snapshot`` table keeps only the latest snapshot per name.)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "removed_range",
        sa.Column("first_seq", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
        sa.Column("removed", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("first_seq <= last_seq AND removed >= 1", name="removed_range_bounds"),
    )
    op.create_table(
        "kept_snapshot",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("name", "seq", name="kept_snapshot_pk"),
    )


def downgrade() -> None:
    op.drop_table("kept_snapshot")
    op.drop_table("removed_range")
