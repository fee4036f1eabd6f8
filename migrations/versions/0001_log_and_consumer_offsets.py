"""The log itself and the named consumers' offsets.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

# ``INTEGER PRIMARY KEY`` makes ``seq`` SQLite's rowid: offsets cost no extra index.
SEQ = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "log",
        sa.Column("seq", SEQ, primary_key=True, autoincrement=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("ts_ns", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("grp", sa.Text(), nullable=True),
        sa.Column("rank", sa.Integer(), nullable=True),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        # CRC-32 is unsigned 32-bit, so it needs a 64-bit column on PostgreSQL.
        sa.Column("crc", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "consumer_offset",
        sa.Column("consumer", sa.Text(), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("consumer_offset")
    op.drop_table("log")
