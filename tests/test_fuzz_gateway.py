"""Hypothesis-generated client frames against a running gateway.

One gateway per test runs in a thread of its own (`BackgroundGateway`)
with a neighbouring session streaming through the whole test; each example
drives its clients with a ``trio.run`` of its own. A small model written here
(not the gateway's parser) says what each frame deserves: ``bad_request``
and a 4400 close as a first frame, ``bad_request`` with the connection kept
inside a session, ``session.created``, an ``input`` answered once (a repeated
id: ``input.duplicate``), a refused resume closed with its own code (4403,
4404, 4429 past the per-address budget), a frame past the WebSocket cap
closed with 1009. After every example the neighbour's stream is still
1, 2, 3, ... with no error, and the gateway still opens sessions.

Frames: arbitrary JSON, known types with wrong, missing or lone-surrogate
fields, random text, binary, oversize frames, frames in the wrong state
(``ack``/``input``/``close`` first, ``open``/``resume`` inside a session),
resume floods (see ``test_fuzz_resume_flood.py``). The figures (inputs tried)
are appended to ``$DUPLEX_FIGURES`` when it names a file.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import hypothesis
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from supervisor.cli._wire_client import WireClient
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import GatewayConfig
from tests.soak_support import (
    BackgroundGateway,
    Frame,
    contiguous,
    fresh_address,
    open_session,
    read_until_closed,
    record_figures,
    seqs,
)

MAX_FRAME = 1024
WS_CAP = 4 * MAX_FRAME  # the library's own cap: past it, a 1009 close
ALLOWED_FAILURES = 3
CONFIG = GatewayConfig(
    port=0,
    max_frame_bytes=MAX_FRAME,
    resume_failures_allowed=ALLOWED_FAILURES,
    resume_failure_window_s=600,
    # Bad resumes of one session come from many addresses here: only the
    # per-address throttle is under test.
    session_resume_failures_allowed=1_000_000,
)
ENGINE = EngineConfig(event_rate_hz=20, deltas_per_answer=2)
LIMIT = 5.0  # per example, real time
NEIGHBOUR = "\x00neighbour"  # replaced by the neighbour's session id when sent
SETTINGS = settings(
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- the model ---------------------------------------------------------------------

FIELDS: dict[str, tuple[str, ...]] = {
    "session.open": ("secret",),
    "session.resume": ("session_id", "resume_token", "last_received_server_event_seq"),
    "ack": ("server_event_seq",),
    "input": ("client_event_id", "text"),
    "session.close": (),
}
INT_FIELDS = {"last_received_server_event_seq", "server_event_seq"}


def _utf8(value: object) -> bool:
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _valid(name: str, value: object) -> bool:
    if name == "secret":
        return value is None or _utf8(value)
    if name in INT_FIELDS:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 0
    return _utf8(value) and value != ""


def classify(message: str | bytes) -> tuple[str, dict[str, object]]:
    """``"too_big"``, ``"bad"``, or the frame's type and its decoded object."""
    size = len(message if isinstance(message, bytes) else message.encode("utf-8", "replace"))
    if size > WS_CAP:
        return "too_big", {}
    if isinstance(message, bytes) or size > MAX_FRAME:
        return "bad", {}
    try:
        data = json.loads(message)
    except (ValueError, RecursionError):
        return "bad", {}
    kind = data.get("type") if isinstance(data, dict) else None
    if not isinstance(kind, str) or kind not in FIELDS:
        return "bad", {}
    if not all(_valid(name, data.get(name)) for name in FIELDS[kind]):
        return "bad", {}
    return kind, data


# -- the frames --------------------------------------------------------------------

scalars = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=10,
)
surrogates = st.sampled_from(["\ud800", "id\udfff", "\udc00x"])
GOOD: dict[str, st.SearchStrategy[object]] = {
    "secret": st.none() | st.text(max_size=10),
    "session_id": st.just(NEIGHBOUR) | st.text(min_size=1, max_size=16),
    "resume_token": st.text(min_size=1, max_size=44),
    "last_received_server_event_seq": st.integers(0, 40),
    "server_event_seq": st.sampled_from([0, 10**6, 2**62]) | st.integers(1, 40),
    "client_event_id": st.sampled_from(["a", "b", "c"]) | st.text(min_size=1, max_size=8),
    "text": st.text(min_size=1, max_size=40),
}


@st.composite
def shaped(draw: st.DrawFn, *, good: bool = False) -> str:
    """A frame of a known type (mostly), each field right, wrong, missing or a surrogate."""
    kind = draw(
        st.sampled_from(list(FIELDS)) if good else st.sampled_from(list(FIELDS)) | json_values
    )
    frame: dict[str, object] = draw(st.dictionaries(st.text(max_size=6), json_values, max_size=2))
    frame["type"] = kind
    for name in FIELDS.get(kind, ()) if isinstance(kind, str) else ():
        hows = ["good"] if good else ["good", "good", "wrong", "missing", "surrogate"]
        how = draw(st.sampled_from(hows))
        if how == "good":
            frame[name] = draw(GOOD[name])
        elif how == "wrong":
            frame[name] = draw(json_values)
        elif how == "surrogate":
            frame[name] = draw(surrogates)
    return json.dumps(frame)


def _big(n: int) -> str:
    return json.dumps({"type": "input", "client_event_id": "big", "text": "x" * n})


frames = st.one_of(
    shaped(good=True),
    shaped(),
    json_values.map(json.dumps),
    st.text(max_size=60),
    st.binary(max_size=64),
    (st.integers(MAX_FRAME - 60, MAX_FRAME + 60) | st.integers(WS_CAP - 90, WS_CAP + 60)).map(_big),
)


# -- driving it --------------------------------------------------------------------


@dataclass(slots=True)
class Tally:
    examples: int = 0
    frames: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)


def _wire(frame: str | bytes, gw: BackgroundGateway) -> str | bytes:
    if isinstance(frame, str):
        return frame.replace(json.dumps(NEIGHBOUR)[1:-1], gw.neighbour.session_id)
    return frame


async def _send(client: WireClient, frame: str | bytes) -> None:
    if isinstance(frame, bytes):
        await client.send_bytes(frame)
    else:
        await client.send_text(frame)


def _errors(received: list[Frame]) -> list[object]:
    return [f.get("code") for f in received if f.get("type") == "error"]


def _resume(session_id: str) -> str:
    return json.dumps(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": "0",
            "last_received_server_event_seq": 0,
        }
    )


async def _first_frames(gw: BackgroundGateway, sent: list[str | bytes], tally: Tally) -> None:
    address = fresh_address()
    failures = 0
    for frame in sent:
        kind, data = classify(frame)
        client = await WireClient.connect(gw.url, local_address=address)
        try:
            await _send(client, frame)
            if kind == "session.open":
                created = await client.receive_json()
                assert created["type"] == "session.created", created
                await client.send_json({"type": "session.close"})
            received, closed = await read_until_closed(client)
        finally:
            await client.cut()
        tally.outcomes[kind] += 1
        if kind == "session.open":
            expected: tuple[list[object], int | None] = ([], 1000)
        elif kind == "too_big":
            expected = ([], 1009)
        elif kind != "session.resume":
            expected = (["bad_request"], 4400)
        elif data["session_id"] != gw.neighbour.session_id:
            # Not a failure, and never throttled: after a restart every client
            # resumes a session the server no longer knows.
            expected = (["unknown_session"], 4404)
        elif failures >= ALLOWED_FAILURES:
            expected = (["resume_throttled"], 4429)
        else:
            expected, failures = (["invalid_resume_token"], 4403), failures + 1
        assert (_errors(received), closed.code) == expected, (frame, received, closed)
        if kind == "session.open":
            # The session streams from its start until the close is handled:
            # its events, if any came first, are its own 1, 2, 3, ... (how many
            # depends on how soon the close ran, so the model cannot say).
            assert contiguous(1, seqs(received)), (frame, received)
        else:
            assert seqs(received) == [], (frame, received)


@pytest.mark.timeout(300)
def test_fuzz_first_frames(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="duplex_supervisor")
    tally = Tally()
    with BackgroundGateway(CONFIG, ENGINE) as gw:

        @SETTINGS
        @given(st.lists(frames, min_size=1, max_size=5))
        # An unknown session after an address's failures: not throttled (found by hypothesis).
        @hypothesis.example(sent=[_resume(NEIGHBOUR)] * 3 + [_resume("0")])
        def example(sent: list[str | bytes]) -> None:
            wire = [_wire(f, gw) for f in sent]
            trio.run(_with_limit, _first_frames, gw, wire, tally)
            tally.examples += 1
            tally.frames += len(wire)
            _still_serving(gw)

        example()
        _still_serving(gw)
    _report(tally, "test_fuzz_first_frames")
    assert tally.examples >= 50, tally
    assert {"bad", "session.open", "session.resume", "too_big"} <= set(tally.outcomes), tally
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def _with_limit(fn: Callable[..., Awaitable[None]], *args: Any) -> None:
    """``fn(*args)`` within ``LIMIT``; at once an error if a gateway among them died."""
    for arg in args:
        if isinstance(arg, BackgroundGateway) and not arg.alive():
            raise AssertionError("the gateway crashed (its error is chained at the end)")
    with trio.fail_after(LIMIT):
        await fn(*args)


def _still_serving(gw: BackgroundGateway) -> None:
    """The gateway runs, opens a session, and the neighbour's stream is intact."""
    assert gw.alive(), gw.crashed

    async def probe() -> None:
        client, _ = await open_session(gw.url)
        await client.send_json({"type": "session.close"})
        _, closed = await read_until_closed(client)
        await client.cut()
        assert closed.code == 1000

    trio.run(_with_limit, probe)
    gw.neighbour.check()


# -- inside a session --------------------------------------------------------------


@dataclass(slots=True)
class Expected:
    errors_at_least: int = 0
    errors_at_most: int = 0
    answered: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    ending: str | None = None  # "session.close" or "too_big" ends the connection


def expect_in_session(sent: list[str | bytes], tally: Tally) -> tuple[Expected, int]:
    """What the frames deserve once a session is open; how many get sent."""
    expected = Expected()
    for n, frame in enumerate(sent, 1):
        kind, data = classify(frame)
        tally.outcomes[f"in_session:{kind}"] += 1
        if kind in ("session.close", "too_big"):
            expected.ending = kind
            return expected, n
        if kind == "input":
            client_event_id = str(data["client_event_id"])
            seen = client_event_id in expected.answered
            (expected.duplicates if seen else expected.answered).append(client_event_id)
        elif kind == "ack" and _acked(data) == 0:
            pass
        elif kind == "ack" and _acked(data) < 10**6:
            expected.errors_at_most += 1  # ahead of the head, or not: it streams meanwhile
        else:
            expected.errors_at_least += 1
            expected.errors_at_most += 1
    return expected, len(sent)


def _acked(data: dict[str, object]) -> int:
    seq = data["server_event_seq"]
    assert isinstance(seq, int)
    return seq


async def _in_session(gw: BackgroundGateway, sent: list[str | bytes], tally: Tally) -> None:
    expected, count = expect_in_session(sent, tally)
    client, created = await open_session(gw.url)
    received: list[Frame] = []
    probe = "probe-" + "-".join(expected.answered)
    try:
        for frame in sent[:count]:
            await _send(client, frame)
        if expected.ending is None:
            await client.send_json({"type": "input", "client_event_id": probe, "text": "?"})
            waiting = {probe, *expected.answered}
            while waiting:
                received.append(await client.receive_json())
                if received[-1].get("type") == "response.done":
                    waiting.discard(str(received[-1].get("client_event_id")))
            await client.send_json({"type": "session.close"})
        more, closed = await read_until_closed(client)
        received += more
    finally:
        await client.cut()
    done = [str(f.get("client_event_id")) for f in received if f.get("type") == "response.done"]
    duplicates = [f.get("client_event_id") for f in received if f.get("type") == "input.duplicate"]
    errors = _errors(received)
    assert set(errors) <= {"bad_request"}, received
    # A frame past the cap closes at once, maybe before earlier answers went out.
    at_least = 0 if expected.ending == "too_big" else expected.errors_at_least
    assert at_least <= len(errors) <= expected.errors_at_most, (sent, received)
    assert contiguous(1, seqs(received)), seqs(received)
    assert closed.code == (1009 if expected.ending == "too_big" else 1000), closed
    if expected.ending is None:
        assert duplicates == expected.duplicates, (sent, received)
        assert sorted(done) == sorted([probe, *expected.answered]), (sent, received)
    else:
        assert len(done) == len(set(done)), received
    if expected.ending == "session.close":
        # Closed for good: its token no longer resumes it.
        gone = await WireClient.connect(gw.url, local_address=fresh_address())
        await gone.send_json(
            {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": created["resume_token"],
                "last_received_server_event_seq": 0,
            }
        )
        refused, closed = await read_until_closed(gone)
        await gone.cut()
        assert (_errors(refused), closed.code) == (["unknown_session"], 4404)


@pytest.mark.timeout(300)
def test_fuzz_frames_inside_a_session(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="duplex_supervisor")
    tally = Tally()
    with BackgroundGateway(CONFIG, ENGINE) as gw:

        @SETTINGS
        @given(st.lists(frames, min_size=1, max_size=6))
        def example(sent: list[str | bytes]) -> None:
            wire = [_wire(f, gw) for f in sent]
            trio.run(_with_limit, _in_session, gw, wire, tally)
            tally.examples += 1
            tally.frames += len(wire)
            assert gw.alive(), gw.crashed
            gw.neighbour.check()

        example()
        _still_serving(gw)
    _report(tally, "test_fuzz_frames_inside_a_session")
    assert tally.examples >= 50, tally
    assert {"in_session:bad", "in_session:input", "in_session:ack"} <= set(tally.outcomes)
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


def _report(tally: Tally, name: str) -> None:
    record_figures(
        name,
        {"examples": tally.examples, "frames": tally.frames, "outcomes": dict(tally.outcomes)},
    )
