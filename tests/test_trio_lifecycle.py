"""The trio door's life cycle: secrets, grace, input, and leaving the context."""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable

import pytest
import trio

from supervisor import (
    InvalidInputError,
    InvalidPayloadError,
    InvalidResumeTokenError,
    RegistryClosedError,
    SendTimeoutError,
)
from supervisor.doors._trio import TrioSessionRegistry
from tests.trio_support import (
    LIMIT,
    Events,
    FakeClock,
    Outcome,
    TokenCatcher,
    Wire,
    duplex_threads,
    gone,
    registry,
)


def _described(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)) + repr(error) + str(error)


async def test_no_token_in_any_repr_str_error_stat_event_or_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    events = Events()
    seen: list[object] = []
    errors: list[BaseException] = []
    tokens: set[str] = set()
    with trio.fail_after(LIMIT):
        async with registry(observer=events, send_timeout_s=0.2) as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            first = created.resume_token.plaintext
            tokens.add(first)
            seen += [created, created.resume_token, await reg.send_event("s", {"n": 1})]
            catcher = TokenCatcher()
            resumed = await reg.resume(
                "s",
                resume_token=first,
                last_received_server_event_seq=0,
                send=Wire().send,
                close=Wire().close,
                activation_payload_factory=catcher,
            )
            second = resumed.resume_token.plaintext
            tokens.add(second)
            seen += [resumed, resumed.resume_token, resumed.replaced_attachment]
            seen += list(resumed.replay_entries)
            for token in (first, first[:-1], ""):  # a stale, a near and an empty one
                with pytest.raises(InvalidResumeTokenError) as bad:
                    await reg.resume(
                        "s",
                        resume_token=token,
                        last_received_server_event_seq=0,
                        send=Wire().send,
                        close=Wire().close,
                    )
                errors.append(bad.value)
            failing = Wire()
            failing.fail(1, ConnectionResetError("activation lost"))
            with pytest.raises(ConnectionResetError) as lost:
                await reg.resume(
                    "s",
                    resume_token=second,
                    last_received_server_event_seq=0,
                    send=failing.send,
                    close=failing.close,
                    activation_payload_factory=catcher,
                )
            errors.append(lost.value)
            tokens.update(t.plaintext for t in catcher.tokens)
            hung = Wire()
            result = await reg.resume(
                "s",
                resume_token=second,
                last_received_server_event_seq=0,
                send=hung.send,
                close=hung.close,
            )
            tokens.add(result.resume_token.plaintext)
            seen += [result, await reg.release_attachment("s"), reg.stats(), reg]
            last = await reg.resume(
                "s",
                resume_token=result.resume_token.plaintext,
                last_received_server_event_seq=1,
                send=hung.send,
                close=hung.close,
            )
            tokens.add(last.resume_token.plaintext)
            hung.hold(1)
            with pytest.raises(SendTimeoutError) as timed_out:
                await reg.send_event("s", {"n": 2})
            errors.append(timed_out.value)
            await events.wait_for("send_timeout", "s")
            seen.append(reg.stats())
    seen += events.events
    assert {"created", "resumed", "invalid_token", "detached", "send_timeout"} <= {
        e.kind for e in events.events
    }
    assert len(tokens) == 5  # created, two resumes, a rolled-back one, the last
    texts = [repr(obj) + str(obj) for obj in seen] + [_described(e) for e in errors]
    texts += [r.getMessage() + (r.exc_text or "") for r in caplog.records]
    for token in tokens:
        for text in texts:
            assert token not in text


async def test_a_session_left_detached_past_its_grace_expires_on_sweep() -> None:
    clock = FakeClock()
    events = Events()
    with trio.fail_after(LIMIT):
        async with registry(clock=clock, disconnect_grace_s=30.0, observer=events) as reg:
            await reg.create("kept", send=Wire().send, close=Wire().close)
            await reg.create("left", send=Wire().send, close=Wire().close)
            await reg.create("claimed", send=Wire().send, close=Wire().close)
            assert await reg.detach("left") is True
            assert await reg.detach("claimed") is True
            await reg.begin_resume("claimed")
            clock.now += 29
            await reg.sweep()
            assert sorted(reg.session_ids()) == ["claimed", "kept", "left"]
            clock.now += 1
            await reg.sweep()
            # Calls after the sweep find the session gone at once ...
            with pytest.raises(KeyError):
                await reg.send_event("left", {"n": 1})
            assert await reg.detach("left") is False
            await events.wait_for("expired", "left")
            # ... and the routing table a supervisor round trip later.
            await gone(reg, "left")
            assert sorted(reg.session_ids()) == ["claimed", "kept"]
            assert reg.stats().sessions_expired == 1
            assert await reg.has_attachment("kept") is True


async def test_the_native_door_is_strict_and_a_rejected_input_changes_nothing() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            with pytest.raises(InvalidPayloadError):
                await reg.send_event("s", {"x": float("inf")})
            with pytest.raises(InvalidPayloadError):
                await reg.send_event("s", [("not", "a mapping")])  # type: ignore[arg-type]
            with pytest.raises(InvalidInputError):
                await reg.acknowledge("s", True)
            with pytest.raises(InvalidInputError):
                await reg.create("", send=wire.send, close=wire.close)
            # An unjournaled payload need only be a mapping.
            assert await reg.send_event("s", {"audio": b"\x00"}, journal=False) is None
            entry = await reg.send_event("s", {"n": 1})
            assert entry is not None
            assert entry.sequence == 1
            assert wire.frames == [{"audio": b"\x00"}, {"n": 1, "server_event_seq": 1}]


async def test_events_queued_without_waiting_reach_the_wire_before_the_context_ends() -> None:
    # Each exit races the actors' deliveries to the loop; ten tries make a
    # drain that ignores events still on their way fail near certainly.
    with trio.fail_after(LIMIT):
        for _ in range(10):
            wire = Wire()
            async with registry() as reg:
                await reg.create("s", send=wire.send, close=wire.close)
                for n in range(20):
                    reg.send_event_nowait("s", {"n": n})
            assert wire.seqs() == list(range(1, 21))


_CALLS: dict[str, Callable[[TrioSessionRegistry], Awaitable[object]]] = {
    "create": lambda reg: reg.create("new", send=Wire().send, close=Wire().close),
    "send_event": lambda reg: reg.send_event("s", {"n": 1}),
    "send_events": lambda reg: reg.send_events("s", [{"n": 1}]),
    "acknowledge": lambda reg: reg.acknowledge("s", 0),
    "detach": lambda reg: reg.detach("s"),
    "release_attachment": lambda reg: reg.release_attachment("s"),
    "begin_resume": lambda reg: reg.begin_resume("s"),
    "end_resume": lambda reg: reg.end_resume("s"),
    "settle_lease_generation": lambda reg: reg.settle_lease_generation("s", 1),
    "has_attachment": lambda reg: reg.has_attachment("s"),
    "is_current_attachment": lambda reg: reg.is_current_attachment("s", 1),
    "authenticate_resume": lambda reg: reg.authenticate_resume(
        "s", resume_token="t", last_received_server_event_seq=0
    ),
    "resume": lambda reg: reg.resume(
        "s",
        resume_token="t",
        last_received_server_event_seq=0,
        send=Wire().send,
        close=Wire().close,
    ),
    "close": lambda reg: reg.close("s"),
    "sweep": lambda reg: reg.sweep(),
}


async def test_leaving_the_context_stops_every_actor_and_refuses_later_calls() -> None:
    waiting = Outcome()
    wires = [Wire() for _ in range(3)]
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as outer:
            async with registry(drain_timeout_s=0.2) as reg:
                for n, wire in enumerate(wires):
                    await reg.create(f"s{n}" if n else "s", send=wire.send, close=wire.close)
                    await reg.send_event(f"s{n}" if n else "s", {"n": n})
                gate = wires[0].hold(2)  # hangs through the exit
                outer.start_soon(waiting.run, lambda: reg.send_event("s", {"n": "hung"}))
                await gate.entered.wait()
                # Sessions and supervisor are actors on this loop: no thread of theirs.
                assert duplex_threads() == []
                assert reg.stats().live == 3
            # A caller still waiting on the hung frame gets an answer, not a hang.
            await waiting.done.wait()
    assert waiting.error is None or isinstance(waiting.error, RegistryClosedError)
    assert duplex_threads() == []
    for name, call in _CALLS.items():
        try:
            await call(reg)
        except RegistryClosedError:
            continue
        pytest.fail(f"{name} after the context did not raise RegistryClosedError")
    with pytest.raises(RegistryClosedError):
        reg.send_event_nowait("s", {"n": 1})
    # Leaving closes the registry, not the clients' transports.
    assert [w.closes for w in wires] == [[], [], []]
