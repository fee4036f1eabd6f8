"""Each record is stored as one frame: its JSON array with the checksum at the end.

Before this revision a record was spread over eight columns (``seq, term, ts_ns, kind, grp,
rank, payload, crc``) and the checksum was CRC-32 over a packed binary layout of them. Reading
a column costs the reader about as much as decoding the payload, so replay spent most of its
time turning columns into Python objects. Now a row is ``seq, term, kind, grp, frame``: the
frame is ``[offset,ts,term,"kind","group",rank,{payload},checksum]`` (see
``eventlog/record.py``, ``FRAME_TAIL``), a page of frames decodes in one msgspec call, and
``term``, ``kind`` and ``grp`` stay as columns only for fencing and filtering.

Every existing row is rewritten into a frame. A row whose stored checksum does not match its
columns under the old layout was damaged before the upgrade: it is carried over with a
checksum that cannot match its frame, so readers still report it at its offset instead of the
upgrade quietly making it valid. A row whose columns cannot even be read as a record (a
column of the wrong type) stops the upgrade with its offset, and nothing is changed.

This file keeps its own copy of both layouts: a migration must keep converting to *this*
revision's format whatever later code does.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29
"""

from __future__ import annotations

import json
import struct
from typing import Any
from zlib import crc32

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

PAGE = 10_000

#: ``,`` + the checksum in ten characters + ``]``: what follows the bytes a checksum covers.
_TAIL = 12

_V1_HEAD = struct.Struct("<qqqqHH")


def _v1_checksum(
    seq: int, ts: int, term: int, kind: bytes, grp: bytes | None, rank: int | None, payload: bytes
) -> int:
    """Revision 0001's checksum: CRC-32 over a packed header, kind, group and payload."""
    head = _V1_HEAD.pack(
        seq,
        ts,
        term,
        -1 if rank is None else rank,
        len(kind),
        0xFFFF if grp is None else len(grp),
    )
    return crc32(payload, crc32(grp or b"", crc32(kind, crc32(head))))


def _frame_body(
    seq: int, ts: int, term: int, kind: bytes, grp: bytes | None, rank: int | None, payload: bytes
) -> bytes:
    return b'[%d,%d,%d,"%s",%s,%s,%s' % (
        seq,
        ts,
        term,
        kind,
        b"null" if grp is None else b'"%s"' % grp,
        b"null" if rank is None else b"%d" % rank,
        payload,
    )


def _text_as_bytes(column: str) -> str:
    """Read a text column as its bytes, so a damaged one cannot fail the decoding."""
    if op.get_bind().dialect.name == "postgresql":
        return f"convert_to({column}, 'UTF8')"
    return f"CAST({column} AS BLOB)"


def _text(column: Any) -> str | None:
    """A text column read as bytes, back to text (a damaged byte becomes U+FFFD: the frame
    keeps the stored bytes, and its checksum reports the damage)."""
    return None if column is None else bytes(column).decode("utf-8", "replace")


def _to_frame(row: Any) -> bytes:
    seq, term, ts, kind, grp, rank, payload, crc = row
    try:
        kind, payload = bytes(kind), bytes(payload)
        grp = None if grp is None else bytes(grp)
        body = _frame_body(seq, ts, term, kind, grp, rank, payload)
        intact = _v1_checksum(seq, ts, term, kind, grp, rank, payload) == crc
    except (TypeError, ValueError, struct.error) as exc:
        raise RuntimeError(
            f"record at offset {seq} cannot be converted to revision 0004's frame: its columns "
            f"are damaged ({exc}); nothing was changed"
        ) from None
    stored = crc32(body)
    if not intact:
        stored ^= 0xFFFFFFFF  # damaged before the upgrade: keep it reported as damaged
    return body + b",%10d]" % stored


def upgrade() -> None:
    """Copy the records, as frames, into a new table that then takes the old one's place.

    One pass and one copy: the file (or the PostgreSQL table) needs room for the old and the new
    table at once, and the old one's pages are free afterwards (``VACUUM`` gives them back).
    """
    bind = op.get_bind()
    op.create_table(
        "log_frames",
        sa.Column(
            "seq",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),  # SQLite: the rowid
            primary_key=True,
            autoincrement=False,
        ),
        sa.Column("term", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("grp", sa.Text(), nullable=True),
        sa.Column("frame", sa.LargeBinary(), nullable=False),
    )
    select = sa.text(
        f"SELECT seq, term, ts_ns, {_text_as_bytes('kind')}, {_text_as_bytes('grp')}, rank, "
        "payload, crc FROM log WHERE seq > :after ORDER BY seq LIMIT :page"
    )
    insert = sa.text(
        "INSERT INTO log_frames (seq, term, kind, grp, frame) "
        "VALUES (:seq, :term, :kind, :grp, :frame)"
    )
    after = 0
    while rows := bind.execute(select, {"after": after, "page": PAGE}).all():
        bind.execute(
            insert,
            [
                {
                    "seq": r[0],
                    "term": r[1],
                    "kind": _text(r[3]),
                    "grp": _text(r[4]),
                    "frame": _to_frame(r),
                }
                for r in rows
            ],
        )
        after = rows[-1][0]
    op.drop_table("log")  # and its index log_grp_seq
    op.rename_table("log_frames", "log")
    if bind.dialect.name == "postgresql":
        op.execute("ALTER INDEX log_frames_pkey RENAME TO log_pkey")
    op.create_index("log_grp_seq", "log", ["grp", "seq"])


def _from_frame(seq: int, frame: bytes) -> dict[str, Any]:
    """Revision 0003's columns of a frame, the payload's bytes taken as they are stored."""
    body, tail = frame[:-_TAIL], frame[-_TAIL:]
    try:
        _, ts, term, kind, grp, rank, _, _ = json.loads(frame)
        k, g = kind.encode(), None if grp is None else grp.encode()
        prefix = _frame_body(seq, ts, term, k, g, rank, b"")
        if not body.startswith(prefix):
            raise ValueError("its fields are not where the frame layout puts them")
        stored = int(tail[1:-1])
    except (ValueError, TypeError, AttributeError) as exc:
        raise RuntimeError(
            f"record at offset {seq} cannot be converted back to revision 0003's columns: its "
            f"frame is damaged ({exc}); nothing was changed"
        ) from None
    payload = body[len(prefix) :]
    crc = _v1_checksum(seq, ts, term, k, g, rank, payload)
    if stored != crc32(body):
        crc ^= 0xFFFFFFFF  # keep a damaged record reported as damaged
    return {"ts": ts, "rank": rank, "payload": payload, "crc": crc}


def downgrade() -> None:
    """Back to revision 0003's columns, with their checksums recomputed from intact frames."""
    bind = op.get_bind()
    with op.batch_alter_table("log") as batch:
        batch.add_column(sa.Column("ts_ns", sa.BigInteger(), nullable=True))
        batch.add_column(sa.Column("rank", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("payload", sa.LargeBinary(), nullable=True))
        batch.add_column(sa.Column("crc", sa.BigInteger(), nullable=True))
    select = sa.text("SELECT seq, frame FROM log WHERE seq > :after ORDER BY seq LIMIT :page")
    update = sa.text(
        "UPDATE log SET ts_ns = :ts, rank = :rank, payload = :payload, crc = :crc WHERE seq = :seq"
    )
    after = 0
    while rows := bind.execute(select, {"after": after, "page": PAGE}).all():
        params = [{"seq": seq, **_from_frame(seq, bytes(frame))} for seq, frame in rows]
        bind.execute(update, params)
        after = rows[-1][0]
    with op.batch_alter_table("log") as batch:
        for column, kind in (
            ("ts_ns", sa.BigInteger()),
            ("payload", sa.LargeBinary()),
            ("crc", sa.BigInteger()),
        ):
            batch.alter_column(column, existing_type=kind, nullable=False)
        batch.drop_column("frame")
