"""Who gets in: throttling per address, dead old tokens, the one-shot recovery.

* Failed resumes are throttled per peer address (any session, any failure
  kind), the right token from a throttled address included, and the token
  is not consumed by it: the owner, from another address, resumes.
* After a successful resume the token it presented is dead, at the gateway
  and at the trio door.
* A presented token comes back (the "recovery" token) only after the
  activation of the resume that presented it failed, only while detached,
  and only once; any later successful resume ends it.
* A token that is not UTF-8 (a lone surrogate) is refused like any wrong
  token: it does not crash the session (four crashes used to close it).
* A session keeps its token's digest only, never the plaintext.

Leaks through logs, reprs and errors: ``test_security_leaks.py``.
"""

from __future__ import annotations

import gc
import json

import pytest
import trio

from actors._credential import ResumeToken
from actors._errors import InvalidResumeTokenError
from actors._state import SessionState
from supervisor.cli._wire_client import WireClient
from supervisor.doors._trio import TrioSessionRegistry
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig
from tests.soak_support import (
    Frame,
    contiguous,
    open_session,
    read_until_closed,
    seqs,
    serving,
)
from tests.trio_support import LIMIT, TokenCatcher, Wire, activation, registry

OWNER, ATTACKER, ELSEWHERE = "127.0.0.1", "127.0.0.2", "127.0.0.3"
ENGINE = EngineConfig(event_rate_hz=50)


async def _events(client: WireClient, count: int) -> list[Frame]:
    frames: list[Frame] = []
    while len(seqs(frames)) < count:
        frames.append(await client.receive_json())
    return frames


async def _resume(
    gw: Gateway, session_id: object, token: object, last: int, address: str
) -> tuple[WireClient, Frame]:
    client = await WireClient.connect(gw.url, local_address=address)
    await client.send_json(
        {
            "type": "session.resume",
            "session_id": session_id,
            "resume_token": token,
            "last_received_server_event_seq": last,
        }
    )
    return client, await client.receive_json()


async def _refused(
    gw: Gateway, session_id: object, token: object, address: str
) -> tuple[object, int | None]:
    client, first = await _resume(gw, session_id, token, 0, address)
    _, closed = await read_until_closed(client)
    await client.cut()
    assert first.get("type") == "error", first
    return first["code"], closed.code


async def _detached(gw: Gateway, session_id: str) -> None:
    while await gw.registry.has_attachment(session_id):
        await trio.sleep(0.01)


async def test_failed_resumes_throttle_their_address_only_and_never_the_owner() -> None:
    config = GatewayConfig(
        port=0,
        resume_failures_allowed=3,
        resume_failure_window_s=60,
        session_resume_failures_allowed=4,
    )
    with trio.fail_after(20):
        async with serving(config, engine=ENGINE) as gw:
            owner, created = await open_session(gw.url, local_address=OWNER)
            other, other_created = await open_session(gw.url)
            sid, token = created["session_id"], created["resume_token"]
            seen = await _events(owner, 3)
            await owner.cut()
            await _detached(gw, str(sid))
            # Three wrong tokens against any sessions use up the address
            # (an unknown session is no failure: after a restart all are)...
            assert await _refused(gw, sid, "guess", ATTACKER) == ("invalid_resume_token", 4403)
            assert await _refused(gw, other_created["session_id"], "guess", ATTACKER) == (
                "invalid_resume_token",
                4403,
            )
            assert await _refused(gw, "sess_nobody", "guess", ATTACKER) == ("unknown_session", 4404)
            assert await _refused(gw, sid, "guess", ATTACKER) == ("invalid_resume_token", 4403)
            # ...then a wrong token from it is answered throttled...
            throttled = ("resume_throttled", 4429)
            assert await _refused(gw, sid, "guess", ATTACKER) == throttled
            assert await _refused(gw, "sess_nobody", "guess", ATTACKER) == ("unknown_session", 4404)
            # ...and the session's own failures (5 from anywhere) throttle it too...
            assert await _refused(gw, sid, "typo", OWNER) == ("invalid_resume_token", 4403)
            assert await _refused(gw, sid, "typo", ELSEWHERE) == throttled
            # ...but the right token is never refused, from the attacker's address too.
            client, resumed = await _resume(gw, sid, token, seqs(seen)[-1], ATTACKER)
            assert resumed["type"] == "session.resumed", resumed
            more = await _events(client, 3)
            assert contiguous(1, seqs(seen + more)), seqs(seen + more)
            assert gw.counters.errors == {
                "invalid_resume_token": 4,
                "unknown_session": 2,
                "resume_throttled": 2,
            }
            # The other session never noticed.
            assert contiguous(1, seqs(await _events(other, 5)))
            for c in (client, other):
                await c.cut()


async def test_the_throttle_forgets_failures_older_than_its_window() -> None:
    config = GatewayConfig(port=0, resume_failures_allowed=1, resume_failure_window_s=0.3)
    with trio.fail_after(20):
        async with serving(config, engine=ENGINE) as gw:
            client, created = await open_session(gw.url)
            sid = str(created["session_id"])
            await client.cut()
            assert await _refused(gw, sid, "t", ATTACKER) == ("invalid_resume_token", 4403)
            assert await _refused(gw, sid, "t", ATTACKER) == ("resume_throttled", 4429)
            await trio.sleep(0.4)
            assert await _refused(gw, sid, "t", ATTACKER) == ("invalid_resume_token", 4403)
            assert await _refused(gw, sid, "t", ATTACKER) == ("resume_throttled", 4429)


async def test_the_old_token_is_dead_after_a_resume_at_the_gateway() -> None:
    with trio.fail_after(20):
        async with serving(GatewayConfig(port=0), engine=ENGINE) as gw:
            first, created = await open_session(gw.url)
            sid, old = created["session_id"], created["resume_token"]
            seen = await _events(first, 2)
            await first.cut()
            second, resumed = await _resume(gw, sid, old, seqs(seen)[-1], ELSEWHERE)
            assert resumed["type"] == "session.resumed"
            new = resumed["resume_token"]
            assert new != old
            seen += await _events(second, 2)
            # A frame confirms the resume; cut before one, the gateway would
            # undo it and let the presented token work once more (by design).
            await second.send_json({"type": "ack", "server_event_seq": seqs(seen)[-1]})
            await second.cut()
            await _detached(gw, str(sid))
            assert await _refused(gw, sid, old, ELSEWHERE) == ("invalid_resume_token", 4403)
            # The failed attempt took nothing from the current token.
            third, again = await _resume(gw, sid, new, seqs(seen)[-1], ELSEWHERE)
            assert again["type"] == "session.resumed", again
            assert again["resume_token"] not in (old, new)
            await third.cut()


async def _try(reg: TrioSessionRegistry, token: str, wire: Wire | None = None) -> str:
    """Resume ``s`` with ``token``: its new token, or ``"refused"``."""
    wire = wire or Wire()
    try:
        result = await reg.resume(
            "s",
            resume_token=token,
            last_received_server_event_seq=0,
            send=wire.send,
            close=wire.close,
            activation_payload_factory=activation,
        )
    except InvalidResumeTokenError:
        return "refused"
    return result.resume_token.plaintext


async def test_the_old_token_is_dead_after_a_resume_at_the_trio_door() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            old = created.resume_token.plaintext
            new = await _try(reg, old)
            assert new not in ("refused", old)
            with pytest.raises(InvalidResumeTokenError):
                await reg.authenticate_resume(
                    "s", resume_token=old, last_received_server_event_seq=0
                )
            assert await reg.detach("s")
            assert await _try(reg, old) == "refused"
            assert await _try(reg, new) != "refused"


async def _failed_activation(reg: TrioSessionRegistry, token: str) -> str:
    """A resume with ``token`` whose activation send fails: the token it rotated to."""
    failing, catcher = Wire(), TokenCatcher()
    failing.fail(1, ConnectionResetError("the socket died under the activation"))
    with pytest.raises(ConnectionResetError):
        await reg.resume(
            "s",
            resume_token=token,
            last_received_server_event_seq=0,
            send=failing.send,
            close=failing.close,
            activation_payload_factory=catcher,
        )
    assert failing.frames == []
    assert await reg.has_attachment("s") is False
    (rotated,) = catcher.tokens
    return rotated.plaintext


@pytest.mark.parametrize("then", ["presented", "rotated"])
async def test_a_presented_token_recovers_once_and_only_after_a_failed_activation(
    then: str,
) -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            first = created.resume_token.plaintext
            current = await _try(reg, first)  # a good resume: `first` is dead for good...
            assert await reg.detach("s")
            assert await _try(reg, first) == "refused"
            # ...and its own later failure cannot bring it back: it was not presented.
            rotated = await _failed_activation(reg, current)
            assert await _try(reg, first) == "refused"
            # The presented token works again, once; so does the rotated one.
            await reg.authenticate_resume(
                "s", resume_token=current, last_received_server_event_seq=0
            )
            await reg.authenticate_resume(
                "s", resume_token=rotated, last_received_server_event_seq=0
            )
            used, other = (current, rotated) if then == "presented" else (rotated, current)
            latest = await _try(reg, used)
            assert latest not in ("refused", current, rotated)
            assert await reg.detach("s")
            # Any successful resume ends the recovery: neither comes back.
            assert await _try(reg, used) == "refused"
            assert await _try(reg, other) == "refused"
            assert await _try(reg, latest) != "refused"


@pytest.mark.parametrize("token", ["\ud800", "tok\udfffen", "\udc00" * 43])
async def test_a_lone_surrogate_token_is_refused_without_a_crash(token: str) -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            for _ in range(5):  # past max_restarts, had each crashed the session
                with pytest.raises(InvalidResumeTokenError):
                    await reg.authenticate_resume(
                        "s", resume_token=token, last_received_server_event_seq=0
                    )
                assert await _try(reg, token) == "refused"
            stats = reg.stats()
            assert (stats.crashes, stats.sessions_failed) == (0, 0)
            assert wire.closes == []
            assert await _try(reg, created.resume_token.plaintext) != "refused"


async def test_a_lone_surrogate_token_at_the_gateway_is_a_bad_request() -> None:
    with trio.fail_after(20):
        async with serving(GatewayConfig(port=0), engine=ENGINE) as gw:
            neighbour, created = await open_session(gw.url)
            client = await WireClient.connect(gw.url)
            frame = {
                "type": "session.resume",
                "session_id": created["session_id"],
                "resume_token": "\ud800",
                "last_received_server_event_seq": 0,
            }
            await client.send_text(json.dumps(frame))
            frames, closed = await read_until_closed(client)
            await client.cut()
            assert [f.get("code") for f in frames] == ["bad_request"]
            assert closed.code == 4400
            assert gw.registry.stats().crashes == 0
            assert contiguous(1, seqs(await _events(neighbour, 5)))
            await neighbour.cut()


async def test_a_session_keeps_no_plaintext_token() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            resumed = await _try(reg, created.resume_token.plaintext)
            tokens = {created.resume_token.plaintext, resumed}
            states = [o for o in gc.get_objects() if isinstance(o, SessionState)]
            assert states
            for state in states:
                for name, value in vars(state).items():
                    assert not isinstance(value, ResumeToken), name
                    assert not (isinstance(value, str) and value in tokens), name
