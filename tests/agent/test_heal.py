"""Healing from members' threads (``agent.heal``), in one process over real loopback sockets.

Each "member" is a model with an SGD-with-momentum optimizer behind a ``StateGate`` and a
``HealServer``; a "replacement" pulls into a fresh model and optimizer of its own. The checks
are on bytes: what arrives is exactly the pinned step's state, also when the member steps
while it serves, when several members serve at once, and when one of them dies mid-pull."""

from __future__ import annotations

import hashlib
import socket
import threading

import pytest
import torch

from foldplane.agent.heal import (
    HealError,
    HealServer,
    Session,
    Snapshot,
    Source,
    StateGate,
    join_tensors,
    pin_sources,
    pull_state,
    split_pieces,
    split_tensors,
)
from foldplane.wire.heal import (
    LENGTH,
    OK,
    GetRequest,
    HealProtocolError,
    PinRequest,
    decode_request,
    encode_request,
)

pytestmark = pytest.mark.timeout(60)


class Member:
    """A model and its optimizer, served between mutations like the elastic DDP serves them."""

    def __init__(self, seed: int, steps: int) -> None:
        torch.manual_seed(seed)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.Linear(96, 8))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1, momentum=0.9)
        self.gate = StateGate()
        self.steps = 0
        for _ in range(steps):
            self.step()
        self.server = HealServer(self.gate, self.snapshot, "127.0.0.1", name=f"m{seed}")

    def state(self) -> dict:
        return {"model": self.model.state_dict(), "optimizers": [self.opt.state_dict()]}

    def snapshot(self, steps: int) -> Snapshot:
        skeleton, tensors = split_tensors(self.state())
        return Snapshot(steps, skeleton, tensors)

    def step(self) -> None:
        """One committed step: gradients, then the optimizer's in-place update inside the gate."""
        self.model.zero_grad()
        x = torch.randn(16, 64, generator=torch.Generator().manual_seed(self.steps))
        self.model(x).square().mean().backward()
        self.gate.begin_mutation()
        self.opt.step()
        self.steps += 1
        self.gate.end_mutation(self.steps)

    def source(self, rank: int) -> Source:
        return Source(rank, *self.server.address)

    def digest(self) -> str:
        return digest(split_tensors(self.state())[1])


def digest(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().numpy().tobytes())
    return h.hexdigest()


def pull_into_fresh(sessions) -> tuple[Member, tuple[str, ...]]:
    """A replacement (never stepped, other seed) that pulls the sessions' state and loads it."""
    fresh = Member(seed=99, steps=0)
    layout = sessions[0].layout
    targets = [torch.empty(shape, dtype=getattr(torch, d)) for d, shape in layout]
    _, failed = pull_state(sessions, targets)
    state = join_tensors(sessions[0].skeleton, targets)
    fresh.model.load_state_dict(state["model"])
    fresh.opt.load_state_dict(state["optimizers"][0])
    return fresh, failed


def test_split_pieces_cuts_the_bytes_into_equal_runs_covering_each_byte_once():
    sizes = [10, 0, 7, 3000, 1]
    for parts in (1, 2, 3, 7):
        runs = split_pieces(sizes, parts)
        assert runs == split_pieces(sizes, parts)  # the same on every rank
        lengths = [sum(b - a for _, a, b in run) for run in runs]
        assert max(lengths) - min(lengths) <= 1, lengths
        covered = sorted((i, a, b) for run in runs for i, a, b in run)
        for i, size in enumerate(sizes):
            mine = [(a, b) for j, a, b in covered if j == i]
            assert sum(b - a for a, b in mine) == size
            assert all(x[1] == y[0] for x, y in zip(mine, mine[1:], strict=False))


def test_several_members_serve_one_replacement_bit_for_bit():
    members = [Member(seed=1, steps=3) for _ in range(3)]
    assert len({m.digest() for m in members}) == 1
    sessions = pin_sources([m.source(r) for r, m in enumerate(members)], timeout_s=10)
    assert [s.steps for s in sessions] == [3, 3, 3]
    fresh, failed = pull_into_fresh(sessions)
    assert failed == ()
    assert fresh.digest() == members[0].digest()


def test_a_member_that_steps_while_it_serves_still_sends_the_pinned_step():
    member = Member(seed=2, steps=2)
    pinned = member.digest()
    (session,) = pin_sources([member.source(0)], timeout_s=10)
    layout = session.layout
    targets = [torch.empty(shape, dtype=getattr(torch, d)) for d, shape in layout]
    # The replacement asks for everything, then the member steps before a byte has left:
    # the gate copies what the session still has to send, the optimizer updates the live state.
    claimed = threading.Event()
    original_claim = member.gate.claim

    def claim_then_step(s, pieces):
        refused = original_claim(s, pieces)
        member.step()
        member.step()
        claimed.set()
        return refused

    member.gate.claim = claim_then_step
    pull_state([session], targets)
    assert claimed.is_set() and member.steps == 4
    assert digest(targets) == pinned
    assert member.digest() != pinned  # the member did move on


def test_a_session_pinned_before_a_step_it_never_claimed_is_refused_not_served_stale():
    member = Member(seed=3, steps=1)
    (session,) = pin_sources([member.source(0)], timeout_s=10)
    member.step()  # nothing was claimed yet: nothing was copied for this session
    targets = [torch.empty(shape, dtype=getattr(torch, d)) for d, shape in session.layout]
    with pytest.raises(HealError, match="gone: the state moved on to step 2"):
        pull_state([session], targets)


class DyingSource:
    """A source that pins like a member, then sends ``budget`` bytes of its share and dies."""

    def __init__(self, member: Member, budget: int) -> None:
        self.member, self.budget = member, budget
        self.listener = socket.create_server(("127.0.0.1", 0))
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        from foldplane.agent.heal import _recv_request, _send_blob

        conn, _ = self.listener.accept()
        session = Session(self.member.snapshot(self.member.steps))
        assert isinstance(_recv_request(conn), PinRequest)
        _send_blob(conn, session.header)
        assert isinstance(_recv_request(conn), GetRequest)
        conn.sendall(OK + b"\x17" * self.budget)
        conn.close()

    def source(self, rank: int) -> Source:
        return Source(rank, *self.listener.getsockname())


def test_a_source_dying_mid_pull_hands_its_share_to_the_others():
    good = [Member(seed=4, steps=2) for _ in range(2)]
    dying = DyingSource(Member(seed=4, steps=2), budget=5000)
    sources = [good[0].source(0), dying.source(1), good[1].source(2)]
    sessions = pin_sources(sources, timeout_s=10)
    fresh, failed = pull_into_fresh(sessions)
    assert fresh.digest() == good[0].digest()  # the dead source's bytes were all sent again
    assert len(failed) == 1 and failed[0].startswith("rank 1: "), failed


def test_a_pull_whose_only_source_dies_says_how_far_it_got():
    dying = DyingSource(Member(seed=5, steps=1), budget=5000)
    (session,) = pin_sources([dying.source(7)], timeout_s=10)
    total = sum(torch.empty(s, dtype=getattr(torch, d)).nbytes for d, s in session.layout)
    targets = [torch.empty(shape, dtype=getattr(torch, d)) for d, shape in session.layout]
    with pytest.raises(HealError, match=rf"of {total} bytes received; no source left: rank 7"):
        pull_state([session], targets)


def test_a_member_that_serves_no_state_is_left_out_of_the_sources():
    member = Member(seed=6, steps=1)
    closed = socket.create_server(("127.0.0.1", 0))
    gone = Source(1, *closed.getsockname())
    closed.close()
    sessions = pin_sources([member.source(0), gone], timeout_s=5)
    assert [s.source.rank for s in sessions] == [0]


def test_a_heal_server_ends_a_connection_that_speaks_another_protocol():
    """A request that is not the heal protocol's (``wire.heal``) ends that connection with a
    logged reason; the server goes on serving the next puller."""
    member = Member(seed=6, steps=1)
    source = member.source(0)
    with socket.create_connection((source.host, source.port), timeout=10) as bad:
        body = b'{"op": "steal"}'
        bad.sendall(LENGTH.pack(len(body)) + body)
        assert bad.recv(1) == b""  # closed, not answered
    (session,) = pin_sources([source], timeout_s=10)
    fresh, failed = pull_into_fresh([session])
    assert not failed and fresh.digest() == member.digest()


def test_heal_requests_are_the_declared_json_objects():
    assert encode_request(PinRequest()) == b'{"op":"pin"}'
    assert decode_request(b'{"op": "get", "pieces": [[0, 0, 8]]}') == GetRequest([(0, 0, 8)])
    with pytest.raises(HealProtocolError, match="not a heal request"):
        decode_request(b'{"op": "get", "pieces": [[0, -1, 8]]}')
