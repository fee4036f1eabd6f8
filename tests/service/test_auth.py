"""Auth: agent tokens, the bind rule, and 401/403 from a real server with auth on."""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

from foldplane.coordinator.auth import (
    Authenticator,
    AuthError,
    BindRefused,
    Principal,
    check_bind,
)
from foldplane.wire.auth import agent_token
from tests.service.conftest import FAST, ROOT, make_server

SECRET = "s3cret-for-tests"
OPERATOR = "operator-token-for-tests"


def test_an_agent_token_speaks_for_exactly_its_rank():
    auth = Authenticator(operator_token=OPERATOR, secret=SECRET)
    token = agent_token(SECRET, "train.v2", 3)
    assert token.startswith("fpa1.train.v2.3.")
    principal = auth.authenticate(f"Bearer {token}")
    assert principal == Principal("agent", "train.v2", 3)
    assert principal.speaks_for("train.v2", 3)
    assert not principal.speaks_for("train.v2", 2)
    assert not principal.speaks_for("train", 3)
    assert principal.may_propose_in("train.v2") and not principal.may_propose_in("train")


@pytest.mark.parametrize(
    ("header", "status"),
    [
        (None, 401),
        ("", 401),
        ("Basic abc", 401),
        ("Bearer", 401),
        ("Bearer wrong", 403),
        (f"Bearer {agent_token('another-secret', 'train', 3)}", 403),
        (f"Bearer {agent_token(SECRET, 'train', 3)[:-1]}0", 403),
        (f"Bearer fpa1.train.03.{agent_token(SECRET, 'train', 3).rsplit('.', 1)[1]}", 403),
    ],
)
def test_missing_or_wrong_tokens_are_refused(header, status):
    auth = Authenticator(operator_token=OPERATOR, secret=SECRET)
    with pytest.raises(AuthError) as err:
        auth.authenticate(header)
    assert err.value.status == status


def test_without_token_or_secret_auth_is_off_and_only_loopback_binds():
    off = Authenticator()
    assert off.authenticate(None).is_operator
    check_bind("127.0.0.1", off, insecure=False)
    check_bind("::1", off, insecure=False)
    with pytest.raises(BindRefused, match="0.0.0.0"):
        check_bind("0.0.0.0", off, insecure=False)
    check_bind("0.0.0.0", off, insecure=True)
    check_bind("0.0.0.0", Authenticator(operator_token=OPERATOR), insecure=False)


def test_serve_refuses_a_public_bind_without_auth(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "foldplane.coordinator",
            "serve",
            "--db",
            str(tmp_path / "x.db"),
            "--host",
            "0.0.0.0",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 2
    assert "refusing to bind '0.0.0.0' without auth" in done.stderr
    assert not (tmp_path / "x.db").exists()


def test_the_token_command_prints_what_the_server_accepts():
    done = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "token", "--group", "train", "--rank", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin", "FOLDPLANE_SECRET": SECRET},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == agent_token(SECRET, "train", 2)
    missing = subprocess.run(
        [sys.executable, "-m", "foldplane.coordinator", "token", "--group", "train", "--rank", "2"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert missing.returncode == 2 and "FOLDPLANE_SECRET" in missing.stderr


@pytest.fixture(scope="module")
def secure_server(tmp_path_factory):
    srv = make_server(
        tmp_path_factory.mktemp("auth"),
        env={"FOLDPLANE_TOKEN": OPERATOR, "FOLDPLANE_SECRET": SECRET},
    ).start()
    op = {"Authorization": f"Bearer {OPERATOR}"}
    r = httpx.post(
        srv.url + "/groups", json={"group": "train", "world_size": 4, **FAST}, headers=op
    )
    assert r.status_code == 201, r.text
    yield srv
    srv.stop()


def _bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_operator_endpoints_need_the_operator_token(secure_server):
    url = secure_server.url
    body = {"group": "other", "world_size": 2}
    assert httpx.post(url + "/groups", json=body).status_code == 401
    assert httpx.post(url + "/groups", json=body, headers=_bearer("nope")).status_code == 403
    agent = _bearer(agent_token(SECRET, "train", 0))
    denied = httpx.post(url + "/groups", json=body, headers=agent)
    assert denied.status_code == 403 and "operator token" in denied.json()["detail"]
    assert httpx.get(url + "/groups/train").status_code == 200  # reads are open
    # ... but the raw log (and the console's reads) are the operator's
    assert httpx.get(url + "/events").status_code == 401
    assert httpx.get(url + "/events", headers=agent).status_code == 403
    r = httpx.post(url + "/groups", json=body, headers=_bearer(OPERATOR))
    assert r.status_code == 201


def test_an_agent_token_used_for_another_rank_is_forbidden(secure_server):
    url = secure_server.url
    mine = _bearer(agent_token(SECRET, "train", 1))
    event = {"type": "join", "group": "train", "rank": 2, "incarnation": "x"}
    r = httpx.post(url + "/agents/events", json={"events": [event]}, headers=mine)
    assert r.status_code == 200
    [result] = r.json()["results"]
    assert result["error"] == "forbidden" and "rank 2" in result["detail"]
    polled = httpx.get(
        url + "/agents/updates",
        params={"group": "train", "rank": 2, "timeout": 0, "protocol": 2},
        headers=mine,
    )
    assert polled.status_code == 403 and polled.json()["error"] == "forbidden"
    death = httpx.post(url + "/agents/deaths", json={"group": "train", "rank": 2}, headers=mine)
    assert death.status_code == 403
    other_group = httpx.post(
        url + "/proposals", json={"group": "other", "op": "deactivate", "ranks": [1]}, headers=mine
    )
    assert other_group.status_code == 403
    assert httpx.post(url + "/agents/events", json={"events": [event]}).status_code == 401
    head = httpx.get(url + "/healthz").json()["head"]
    logged = httpx.get(
        url + "/events",
        params={"after": head - 5 if head > 5 else 0},
        headers=_bearer(OPERATOR),  # the raw log is the operator's when auth is on
    ).json()["events"]
    assert all(e["payload"].get("incarnation") != "x" for e in logged)


def test_agent_tokens_work_for_their_own_rank_and_per_event(secure_server):
    url = secure_server.url
    own = _bearer(agent_token(SECRET, "train", 1))
    join = {"type": "join", "group": "train", "rank": 1, "incarnation": "inc-1"}
    r = httpx.post(url + "/agents/events", json={"events": [join]}, headers=own)
    assert "offset" in r.json()["results"][0], r.text
    # one host batches two ranks, each event carrying its own rank's token
    batch = [
        {
            "type": "join",
            "group": "train",
            "rank": 2,
            "incarnation": "inc-2",
            "token": agent_token(SECRET, "train", 2),
        },
        {
            "type": "join",
            "group": "train",
            "rank": 3,
            "incarnation": "inc-3",
            "token": agent_token(SECRET, "train", 2),
        },
    ]
    results = httpx.post(url + "/agents/events", json={"events": batch}, headers=own).json()[
        "results"
    ]
    assert "offset" in results[0]
    assert results[1]["error"] == "forbidden"
    polled = httpx.get(
        url + "/agents/updates",
        params={"group": "train", "rank": 1, "timeout": 0, "protocol": 2},
        headers=own,
    )
    assert polled.status_code == 200, polled.text
    proposal = httpx.post(
        url + "/proposals", json={"group": "train", "op": "deactivate", "ranks": [0]}, headers=own
    )
    assert proposal.status_code in (200, 202)
    assert proposal.json()["proposer"] == "rank:1"


def test_several_agent_tokens_in_one_header_speak_for_all_their_ranks():
    auth = Authenticator(operator_token=OPERATOR, secret=SECRET)
    t1, t2, t3 = (agent_token(SECRET, "train", r) for r in (1, 2, 3))
    host = auth.authenticate(f"Bearer {t1},{t2}")
    assert host == Principal("agent", "train", 1, frozenset({2}))
    assert host.speaks_for("train", 1) and host.speaks_for("train", 2)
    assert not host.speaks_for("train", 3) and not host.speaks_for("other", 1)
    assert host.describe() == "agents train/[1, 2]"
    assert auth.authenticate(f"Bearer {t1}, {t2} ,{t3}").more_ranks == {2, 3}
    with pytest.raises(AuthError) as groups:
        auth.authenticate(f"Bearer {t1},{agent_token(SECRET, 'other', 2)}")
    assert groups.value.status == 403 and "several groups" in groups.value.detail
    with pytest.raises(AuthError) as forged:
        auth.authenticate(f"Bearer {t1},{t2[:-1]}{'0' if t2[-1] != '0' else '1'}")
    assert forged.value.status == 403
    assert auth.authenticate(f"Bearer {t1},{OPERATOR}").is_operator


def test_a_rank_token_cannot_poll_for_its_hosts_other_ranks_but_the_hosts_tokens_can(
    secure_server,
):
    url = secure_server.url
    params = {"group": "train", "ranks": "1-2", "timeout": 0, "protocol": 2}
    t1, t2 = agent_token(SECRET, "train", 1), agent_token(SECRET, "train", 2)
    alone = httpx.get(url + "/agents/updates", params=params, headers=_bearer(t1))
    assert alone.status_code == 403, alone.text
    assert alone.json()["error"] == "forbidden"
    assert "agent train/1" in alone.json()["detail"] and "[2]" in alone.json()["detail"]
    both = httpx.get(url + "/agents/updates", params=params, headers=_bearer(f"{t1},{t2}"))
    assert both.status_code == 200, both.text
    assert set(both.json()) >= {"updates", "next_after", "resync", "store"}
    # the host's header also carries the events of each of its ranks
    event = {"type": "join", "group": "train", "rank": 2, "incarnation": "inc-host-2"}
    wrong = httpx.post(
        url + "/agents/events",
        json={"events": [{**event, "rank": 3}]},
        headers=_bearer(f"{t1},{t2}"),
    )
    assert wrong.json()["results"][0]["error"] == "forbidden"
    right = httpx.post(
        url + "/agents/events", json={"events": [event]}, headers=_bearer(f"{t1},{t2}")
    )
    assert right.status_code == 200 and "offset" in right.json()["results"][0], right.text


# -- tokens parsed strictly: a malformed token is a 401 everywhere, never a 500 -----------------

#: ``"\u00b2".isdigit()`` is true and ``int("\u00b2")`` raises: the rank field must be ASCII.
SUPERSCRIPT = "fpa1.train.\u00b2.00"
MALFORMED_TOKENS = [
    SUPERSCRIPT,
    "fpa1.train.\u0663.00",  # an Arabic-Indic digit three
    "fpa1.tr\u00e4in.3.00",
    "operator-token-for-tests\u200b",  # the operator token with a zero-width space
    "fpa1.train.3.00 extra",
]


@pytest.mark.parametrize("token", MALFORMED_TOKENS)
def test_a_token_that_is_not_a_plain_bearer_token_is_a_401(token):
    auth = Authenticator(operator_token=OPERATOR, secret=SECRET)
    with pytest.raises(AuthError) as err:
        auth.authenticate(f"Bearer {token}")
    assert err.value.status == 401 and "malformed" in err.value.detail


@pytest.mark.parametrize(
    "token",
    [
        "fpa1.train.65536." + "0" * 64,  # beyond the ranks a group may have
        "fpa1.train." + "9" * 5000 + ".00",  # more digits than int() takes
        "fpa1.train.-1.00",
        "fpa1.train.1e3.00",
    ],
)
def test_a_well_formed_token_with_an_impossible_rank_is_a_403(token):
    auth = Authenticator(operator_token=OPERATOR, secret=SECRET)
    with pytest.raises(AuthError) as err:
        auth.authenticate(f"Bearer {token}")
    assert err.value.status == 403


def _raw_bearer(token: str) -> dict[str, bytes]:
    """The header as a client sends it on the wire, one byte per latin-1 character."""
    return {"Authorization": b"Bearer " + token.encode("latin-1", errors="replace")}


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/agents/events", {"events": []}),
        ("GET", "/agents/updates?group=train&rank=0&timeout=0&protocol=2", None),
        ("POST", "/agents/deaths", {"group": "train", "rank": 0}),
        ("POST", "/proposals", {"group": "train", "op": "deactivate", "ranks": [0]}),
        ("POST", "/groups", {"group": "other2", "world_size": 2}),
    ],
)
def test_the_superscript_token_is_a_401_on_every_authenticated_endpoint(
    secure_server, method, path, body
):
    r = httpx.request(method, secure_server.url + path, json=body, headers=_raw_bearer(SUPERSCRIPT))
    assert r.status_code == 401, r.text
    assert r.json()["error"] == "unauthorized" and r.headers["www-authenticate"] == "Bearer"
    # the twin: the operator token on the same request is served
    ok = httpx.request(method, secure_server.url + path, json=body, headers=_bearer(OPERATOR))
    assert ok.status_code < 400, ok.text


def test_a_malformed_per_event_token_fails_only_its_own_event(secure_server):
    url = secure_server.url
    own = _bearer(agent_token(SECRET, "train", 1))
    batch = [
        {"type": "join", "group": "train", "rank": 1, "incarnation": "strict-1"},
        {
            "type": "join",
            "group": "train",
            "rank": 2,
            "incarnation": "strict-2",
            "token": SUPERSCRIPT,
        },
        {
            "type": "join",
            "group": "train",
            "rank": 3,
            "incarnation": "strict-3",
            "token": agent_token(SECRET, "train", 3),
        },
    ]
    r = httpx.post(url + "/agents/events", json={"events": batch}, headers=own)
    assert r.status_code == 200, r.text
    first, second, third = r.json()["results"]
    assert "offset" in first and "offset" in third, r.text
    assert second["error"] == "forbidden" and "malformed" in second["detail"], second
