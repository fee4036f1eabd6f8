"""The fenced head row, the group index, projections and snapshots.

``log_head`` holds the writers' term and the next offset. It is seeded from the records already
in the log (a log written at revision 0001 keeps its offsets and continues after them).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "log_head",
        sa.Column("id", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("next_seq", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("id = 1", name="log_head_single_row"),
    )
    op.execute(
        "INSERT INTO log_head (id, term, next_seq) "
        "SELECT 1, COALESCE(MAX(term), 0), COALESCE(MAX(seq), 0) + 1 FROM log"
    )
    op.create_index("log_grp_seq", "log", ["grp", "seq"])
    op.create_table(
        "projection",
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("grp", sa.Text(), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("doc", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("kind", "grp", "seq", name="projection_pk"),
    )
    op.create_table(
        "snapshot",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("snapshot")
    op.drop_table("projection")
    op.drop_index("log_grp_seq", table_name="log")
    op.drop_table("log_head")
