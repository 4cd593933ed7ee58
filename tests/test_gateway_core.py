"""The sans-I/O gateway core with plain calls and made-up times: frames and ticks in,
actions out. No sockets, no loop."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from supervisor.gateway._auth import Handshake, TrustedProxies, bearer_secret, client_address
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._core import (
    AnswerInput,
    CallAck,
    CloseSocket,
    ConnectionCore,
    EndConnection,
    EndSession,
    InputLedger,
    OpenRequested,
    Phase,
    Ping,
    ResumeRequested,
    SendDirect,
    SendThroughSession,
    Throttles,
)
from supervisor.gateway._engine import load_engine_factory
from supervisor.gateway._protocol import OpenSession, ProtocolError, frame_text

CONFIG = GatewayConfig(
    handshake_timeout_s=5, ping_interval_s=10, idle_timeout_s=30, max_inputs_per_second=2
)


def _frame(**fields: object) -> str:
    return json.dumps(fields)


def _open(core: ConnectionCore, now: float = 0.0) -> None:
    assert core.receive(_frame(type="session.open"), now) == [
        OpenRequested(frame=core_open_frame())
    ]
    core.admitted("s1", 1, resumed=False, now=now)


def core_open_frame() -> OpenSession:
    return OpenSession(secret=None)


def test_no_first_frame_by_the_deadline_is_4408() -> None:
    core = ConnectionCore(CONFIG, now=100.0)
    assert core.next_deadline() == 105.0
    assert core.tick(104.9) == []
    actions = core.tick(105.0)
    assert isinstance(actions[0], SendDirect)
    assert actions[0].frame["code"] == "handshake_timeout"
    assert actions[1] == CloseSocket(code=4408, reason="handshake_timeout")
    assert core.phase is Phase.ENDED
    assert core.receive(_frame(type="session.open"), 106) == []


def test_the_first_frame_opens_or_resumes_and_nothing_else() -> None:
    core = ConnectionCore(CONFIG, now=0)
    actions = core.receive(_frame(type="ack", server_event_seq=1), 1)
    assert actions[-1] == CloseSocket(code=4400, reason="bad_request")
    core = ConnectionCore(CONFIG, now=0)
    resume = _frame(
        type="session.resume",
        session_id="s",
        resume_token="tok-9f3a",
        last_received_server_event_seq=0,
    )
    [action] = core.receive(resume, 1)
    assert isinstance(action, ResumeRequested)
    assert "tok-9f3a" not in repr(action)  # the token stays out of every repr
    # While admitting, the shell reads nothing more; no deadline runs.
    assert core.next_deadline() is None


def test_a_resume_is_unconfirmed_until_the_client_speaks() -> None:
    core = ConnectionCore(CONFIG, now=0)
    core.receive(
        _frame(
            type="session.resume",
            session_id="s",
            resume_token="t",
            last_received_server_event_seq=0,
        ),
        0,
    )
    core.admitted("s", 2, resumed=True, now=0)
    assert core.unconfirmed_resume
    assert core.receive(_frame(type="ack", server_event_seq=3), 1) == [CallAck(server_event_seq=3)]
    assert not core.unconfirmed_resume


def test_after_the_open_frames_become_actions() -> None:
    core = ConnectionCore(CONFIG, now=0)
    _open(core)
    assert core.receive(_frame(type="input", client_event_id="a", text="hi"), 1) == [
        AnswerInput(client_event_id="a", text="hi")
    ]
    [reply] = core.receive(_frame(type="session.open"), 1)
    assert isinstance(reply, SendThroughSession) and reply.frame["code"] == "bad_request"
    assert core.phase.value == "open"  # not fatal once open
    assert core.receive(_frame(type="session.close"), 2) == [EndSession()]
    assert core.phase.value == "ended"


def test_inputs_past_the_rate_are_refused_with_their_id() -> None:
    core = ConnectionCore(CONFIG, now=0)
    _open(core)
    sent = [
        core.receive(_frame(type="input", client_event_id=f"i{n}", text="x"), 1.0) for n in range(3)
    ]
    assert [type(a[0]) for a in sent] == [AnswerInput, AnswerInput, SendThroughSession]
    refused = sent[2][0]
    assert isinstance(refused, SendThroughSession)
    assert refused.frame["code"] == "rate_limited"
    assert refused.frame["client_event_id"] == "i2"
    # Half a second later one more token is in the bucket (2 a second).
    assert isinstance(
        core.receive(_frame(type="input", client_event_id="i3", text="x"), 1.5)[0], AnswerInput
    )


def test_keepalive_pings_then_ends_a_silent_peer() -> None:
    core = ConnectionCore(CONFIG, now=0)
    _open(core)
    assert core.next_deadline() == 10
    assert core.tick(10) == [Ping()]
    assert core.next_deadline() == 40  # the idle timeout after the ping
    core.pong(12)
    assert core.next_deadline() == 22
    assert core.tick(22) == [Ping()]
    assert core.tick(51.9) == []
    assert core.tick(52) == [EndConnection(why="idle")]


def test_a_shell_that_pings_by_itself_gets_no_ping_actions() -> None:
    core = ConnectionCore(CONFIG, now=0, keepalive=False)
    _open(core)
    assert core.next_deadline() is None
    assert core.tick(1_000) == []


def test_fatal_errors_close_with_their_code_and_others_reply() -> None:
    core = ConnectionCore(CONFIG, now=0)
    _open(core)
    [reply] = core.fail(ProtocolError("busy", "later", client_event_id="x"))
    assert isinstance(reply, SendThroughSession)
    actions = core.fail(ProtocolError("overflow", "too much"))
    assert actions[1] == CloseSocket(code=4413, reason="overflow")
    assert core.fail(ProtocolError("overflow", "again")) == []
    assert core.errors == ["busy", "overflow"]


def test_the_input_ledger_answers_each_id_once_for_the_session_life() -> None:
    ledger = InputLedger(max_ids=3, max_in_flight=2)
    assert [ledger.decide(i) for i in ("a", "b", "c")] == ["answer", "answer", "busy"]
    ledger.done()
    assert ledger.decide("c") == "answer"
    assert ledger.decide("a") == "duplicate"
    assert ledger.decide("d") == "input_limit"  # the stated bound: refused, never answered
    core = ConnectionCore(CONFIG, now=0)
    _open(core)
    assert core.input_verdict("a", "answer") == []
    [dup] = core.input_verdict("a", "duplicate")
    assert isinstance(dup, SendThroughSession) and dup.frame == {
        "type": "input.duplicate",
        "client_event_id": "a",
    }


@pytest.mark.parametrize(
    ("peer", "forwarded", "expected"),
    [
        ("203.0.113.9", ["198.51.100.1"], "203.0.113.9"),  # not a trusted proxy: ignored
        ("10.0.0.5", ["198.51.100.1"], "198.51.100.1"),
        ("10.0.0.5", ["1.1.1.1, 198.51.100.1, 10.0.0.7"], "198.51.100.1"),  # right-most untrusted
        ("10.0.0.5", ["1.1.1.1", "198.51.100.1"], "198.51.100.1"),  # several headers, in order
        ("10.0.0.5", [], "10.0.0.5"),
        ("10.0.0.5", ["10.0.0.6"], "10.0.0.6"),  # only proxies: the farthest
    ],
)
def test_the_client_address_comes_through_trusted_proxies_only(
    peer: str, forwarded: list[str], expected: str
) -> None:
    trusted = TrustedProxies(["10.0.0.0/8"])
    assert client_address(peer, forwarded, trusted) == expected
    assert client_address(peer, forwarded, TrustedProxies()) == peer


def test_bearer_secret_checks_the_header_or_the_query() -> None:
    check = bearer_secret("s3cret")

    def handshake(headers: dict[str, str], query: str = "") -> Handshake:
        return Handshake(path="/v1", query=query, headers=headers, peer="p", client="p")

    assert check(handshake({"authorization": "Bearer s3cret"})) == "bearer"
    assert check(handshake({}, "token=s3cret")) == "bearer"
    assert check(handshake({"authorization": "Bearer nope"})) is None
    assert check(handshake({})) is None
    assert "s3cret" not in repr(handshake({"authorization": "Bearer s3cret"}))


def test_engine_factories_are_named_module_colon_attribute() -> None:
    factory = load_engine_factory("examples.fastapi_app:SpellingEngine")
    assert hasattr(factory(), "answer")
    for bad, complaint in [
        ("examples.fastapi_app", "expected module:name"),
        ("no_such_module_here:x", "cannot import"),
        ("examples.fastapi_app:Nope", "has no 'Nope'"),
        ("examples.fastapi_app:engine", "is not callable"),
    ]:
        with pytest.raises(ValueError, match=complaint):
            load_engine_factory(bad)


def test_the_core_and_what_it_imports_do_no_io() -> None:
    """_core.py reaches only the pure gateway modules, and those no runtime of I/O."""
    import ast
    from pathlib import Path

    gateway = Path(__file__).resolve().parent.parent / "supervisor" / "gateway"
    pure = {
        "_core",
        "_actions",
        "_ledgers",
        "_throttles",
        "_config",
        "_flag_spec",
        "_limits",
        "_protocol",
    }
    forbidden = {"trio", "anyio", "asyncio", "sniffio", "threading", "socket", "pykka"}
    for name in pure:
        tree = ast.parse((gateway / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                modules = [node.module or ""]
            else:
                continue
            for module in modules:
                assert module.split(".")[0] not in forbidden, (name, module)
                if module.startswith("supervisor."):
                    assert module.startswith("supervisor.gateway."), (name, module)
                    assert module.rsplit(".", 1)[1] in pure, (name, module)


def test_throttles_answer_a_failure_its_own_error_until_a_key_is_blocked() -> None:
    config = GatewayConfig(
        resume_failures_allowed=2, session_resume_failures_allowed=3, secret_failures_allowed=1
    )
    throttles = Throttles(config)
    wrong = ProtocolError("invalid_resume_token", "no")
    codes = [throttles.failed_resume("a1", "s1", wrong, now=0).code for _ in range(3)]
    assert codes == ["invalid_resume_token", "invalid_resume_token", "resume_throttled"]
    # Another address: its own count, until the session's own limit (3) is passed.
    assert throttles.failed_resume("a2", "s1", wrong, now=0).code == "resume_throttled"
    assert throttles.failed_resume("a2", "s2", wrong, now=0).code == "invalid_resume_token"
    assert throttles.failed_resume("a1", "s1", wrong, now=61).code == "invalid_resume_token"
    assert throttles.failed_credential("a1", "no secret", now=61).code == "unauthorized"
    assert throttles.failed_credential("a1", "no secret", now=61).code == "secret_throttled"
    # At 61 the failures of 0 expired: a2 and s2 are forgotten; a1, s1, and a1's secret stay.
    assert len(throttles) == 3


def test_an_input_text_is_at_most_16384_characters() -> None:
    core = ConnectionCore(CONFIG, now=0.0)
    _open(core)
    longest = "x" * 16_384
    assert core.receive(_frame(type="input", client_event_id="a", text=longest), 0.0) == [
        AnswerInput(client_event_id="a", text=longest)
    ]
    (reply,) = core.receive(_frame(type="input", client_event_id="b", text=longest + "x"), 5.0)
    assert isinstance(reply, SendThroughSession)
    assert (reply.frame["type"], reply.frame["code"]) == ("error", "bad_request")
    assert core.phase is Phase.OPEN  # not fatal inside a session


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)


@given(st.dictionaries(st.text(), _JSON, max_size=6))
def test_frame_text_is_what_json_dumps_gives(frame: dict[str, object]) -> None:
    # The prebuilt encoder must put on the wire exactly the text it replaced.
    assert frame_text(frame) == json.dumps(frame, separators=(",", ":"), ensure_ascii=False)


def test_frame_text_keeps_non_ascii_and_lone_surrogates_as_json_dumps_does() -> None:
    frame = {"delta": 'grüße \ud800 "quoted"', "server_event_seq": 3, "t": 1.5}
    assert frame_text(frame) == json.dumps(frame, separators=(",", ":"), ensure_ascii=False)
    assert frame_text(frame).startswith('{"delta":"grüße')
