"""Every code has one status everywhere: the table in ``wire.codes`` is the only place a code or
a proposal status is written, and each surface (the API's answers, the relay, the agent) answers
a code with the status the table gives it."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import pytest

from foldplane.agent import relay
from foldplane.agent.machine import AgentConfig, AgentMachine, EventsAnswered, Start, Stopped
from foldplane.api import models
from foldplane.api.errors import _FRAMEWORK_CODES, ApiError, BodyTooLarge, answer_of
from foldplane.coordinator.auth import AuthError
from foldplane.coordinator.host.inputs import HostUnavailable
from foldplane.coordinator.host.replica import NotLeader
from foldplane.wire import codes
from foldplane.wire.codes import CODES, FATAL_ERRORS, error_body, status_of

ROOT = Path(__file__).resolve().parents[2]

#: String constants outside ``wire`` that equal a code but are not one: the agent's stop
#: reason ``closed``, the limits table's word "closed", the effect ``group_failed`` and its
#: story entry, the record kind and effect ``group_ended``, the proposal model's literal
#: (checked against the table below) and the data plane's own work states.
NOT_CODES = {
    ("agent/machine.py", "closed"),
    ("api/limits.py", "closed"),
    ("coordinator/fold/effects.py", "group_failed"),
    ("coordinator/fold/effects.py", "group_ended"),
    ("coordinator/fold/fencing.py", "group_ended"),
    ("coordinator/fold/machine.py", "group_ended"),
    ("wire/inputs.py", "group_ended"),
    ("eventlog/record.py", "group_ended"),
    ("api/routes/operator.py", "group_ended"),
    ("coordinator/host/story.py", "group_failed"),
    ("api/models.py", "pending"),
    ("api/models.py", "applied"),
    ("api/models.py", "applied_with_dropped_ranks"),
    ("api/models.py", "rejected"),
    ("agent/dataplane/work.py", "pending"),
    ("facets/rendezvous/fold.py", "closed"),
    ("facets/rendezvous/routes.py", "closed"),
    ("facets/rendezvous/story.py", "closed"),
    ("agent/rendezvous/handler.py", "closed"),
    ("wire/life.py", "not_joined"),  # a key of a group's rank_counts, declared once there
}


def test_each_code_is_declared_once_with_an_http_status_and_a_meaning() -> None:
    assert len(CODES) == len(set(CODES))
    for name, code in CODES.items():
        assert code.name == name and getattr(codes, name.upper()) == name
        assert 200 <= code.status <= 599, code
        assert code.meaning and code.family in typing.get_args(codes.Family), code


def test_no_code_is_written_outside_wire() -> None:
    """A code is named by its constant; a string equal to one is either in ``NOT_CODES`` or a
    new literal that must be the constant instead."""
    found = set()
    for package in ("agent", "api", "coordinator", "eventlog", "wire"):
        for path in sorted((ROOT / package).rglob("*.py")):
            where = path.relative_to(ROOT).as_posix()
            if where == "wire/codes.py":
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in CODES:
                    found.add((where, node.value))
    assert found - NOT_CODES == set(), "use the wire.codes constants for these"


def test_the_api_answers_each_code_with_its_status() -> None:
    for name in CODES:
        assert answer_of(ApiError(name, "why")) == (status_of(name), error_body(name, "why"))
    for name in (codes.UNAUTHORIZED, codes.FORBIDDEN):
        assert answer_of(AuthError(name, "why"))[0] == status_of(name)  # type: ignore[index]
    for name in (c.name for c in CODES.values() if c.family == "host"):
        status, body = answer_of(HostUnavailable(name, "why"))  # type: ignore[misc]
        assert status == status_of(name) == 503 and body["error"] == name
    status, body = answer_of(NotLeader("http://b:1", "a standby"))  # type: ignore[misc]
    assert (status, body["error"], body["leader"]) == (503, codes.NOT_LEADER, "http://b:1")
    assert answer_of(BodyTooLarge(10))[0] == status_of(codes.BODY_TOO_LARGE)  # type: ignore[index]
    # what the framework raises by status is named by the code of that status
    for status, name in _FRAMEWORK_CODES.items():
        assert status_of(name) == status


def test_the_relay_answers_each_code_with_its_status() -> None:
    for name in CODES:
        assert relay.error(name, "why") == (status_of(name), error_body(name, "why"))
    # a code a newer coordinator sends is passed on as retryable
    assert relay.error("a_code_of_tomorrow", "why", default_status=503)[0] == 503
    with pytest.raises(KeyError, match="a_code_of_tomorrow"):
        status_of("a_code_of_tomorrow")


@pytest.mark.parametrize("code", sorted(FATAL_ERRORS))
def test_the_agent_ends_on_each_fatal_code(code: str) -> None:
    """The agent decides by the code, never by a status: a join refused with a fatal code (one
    event's result, or a whole batch the HTTP surface refused, which ``agent.host`` hands on
    with its code) ends it."""
    machine = AgentMachine(AgentConfig(group="g", rank=0, incarnation="i1"))
    machine.step(Start(0.0))
    actions = machine.step(EventsAnswered(0.0, (error_body(code, "no"),)))
    assert actions == [Stopped("failed", f"join refused: {code}: no")]


def test_the_proposal_model_lists_the_wire_statuses() -> None:
    status = typing.get_type_hints(models.ProposalBody)["status"]
    assert set(typing.get_args(status)) == {
        codes.PENDING,
        codes.APPLIED,
        codes.APPLIED_WITH_DROPPED_RANKS,
        codes.REJECTED,
    }, status
    assert {c.name for c in CODES.values() if c.family == "proposal"} == {
        codes.PENDING,
        *codes.TERMINAL,
    }
    assert status_of(codes.PENDING) == 202 and {status_of(s) for s in codes.TERMINAL} == {200}
