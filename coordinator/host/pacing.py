"""How the long polls a batch woke are answered: all at once, or in shares while inputs wait."""

from __future__ import annotations

from .journal import UpdateJournals


class PollPacing:
    """Answers woken long polls, in shares while other inputs are queued.

    A view change wakes every agent host's long poll of its group at once (twice: prepare,
    then commit), and each answer brings back an ACK request and the next poll. While other
    inputs wait to be taken at once, that burst is spread over the next ``spread`` batches, at
    least ``release`` polls a batch, oldest first, so the inputs queued meanwhile are served
    between its parts instead of behind all of it; otherwise every woken poll is answered at
    once. The host says which (``Host._next_turn_at_once``): heartbeats that wait for their
    shared record do not count, since no batch follows until they are due.
    """

    def __init__(self, *, release: int = 8, spread: int = 8) -> None:
        if release < 1 or spread < 1:
            raise ValueError(
                f"poll_release and poll_spread must be at least 1, got {release} and {spread}"
            )
        self.release = release
        self.spread = spread

    def answer(self, journals: UpdateJournals, *, inputs_waiting: bool) -> None:
        """Answer one share of the polls ``journals`` woke when inputs wait, else all of them."""
        if inputs_waiting:
            journals.release_share(self.release, self.spread)
        else:
            journals.release()
