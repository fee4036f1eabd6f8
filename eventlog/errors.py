"""The errors a log raises. Every message names the offset, term, revision or path involved."""

from __future__ import annotations


class LogError(Exception):
    """Base of every error the log raises about its storage (not about a caller's input)."""


class LogClosed(LogError):
    """The log was closed; appends, reads and tails after ``close()`` raise this."""


class ChecksumError(LogError):
    """A stored record does not match its checksum: it was damaged after it was written.

    Readers never skip such a record silently; ``offset`` names it so an operator can find it.
    """

    def __init__(self, offset: int, detail: str) -> None:
        super().__init__(f"record at offset {offset} is damaged: {detail}")
        self.offset = offset


class StaleTermError(LogError):
    """An append was fenced: the head row holds a newer term than the writer's.

    Nothing of the refused batch was written. The writer was deposed and must stop appending.
    """

    def __init__(self, term: int, head_term: int) -> None:
        super().__init__(
            f"append fenced: this writer holds term {term} but the log's head is at term "
            f"{head_term}; nothing was written (another writer claimed the log)"
        )
        self.term = term
        self.head_term = head_term


class SchemaTooNewError(LogError):
    """The database's schema revision is newer than (unknown to) this code's migrations."""

    def __init__(self, where: str, db_revision: str, code_head: str) -> None:
        super().__init__(
            f"{where} has schema revision {db_revision!r}, which this code does not know "
            f"(its newest migration is {code_head!r}); it was written by a newer foldplane, "
            "so upgrade foldplane instead of opening it with this version"
        )
        self.db_revision = db_revision
        self.code_head = code_head
