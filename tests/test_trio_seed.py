"""The seed's behaviours through the trio door: create, send, resume, journal, close."""

from __future__ import annotations

import pytest
import trio

from actors._journal import JournalEntry
from supervisor import (
    DuplicateSessionError,
    InvalidResumeTokenError,
    JournalGapError,
    JournalOverflowError,
)
from tests.trio_support import LIMIT, FakeClock, TokenCatcher, Wire, registry


async def test_create_sends_sequenced_events_and_refuses_a_duplicate_id() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close, lease_generation=3)
            assert (created.session_id, created.attachment_generation) == ("s", 1)
            assert len(created.resume_token.plaintext) >= 43  # 256 bits, url-safe base64
            payload = {"type": "delta", "text": "hi"}
            entries = [await reg.send_event("s", payload) for _ in range(3)]
            assert [e.sequence for e in entries if e is not None] == [1, 2, 3]
            assert payload == {"type": "delta", "text": "hi"}  # the caller's dict untouched
            assert wire.frames == [{**payload, "server_event_seq": n} for n in (1, 2, 3)]
            intruder = Wire()
            with pytest.raises(DuplicateSessionError) as caught:
                await reg.create("s", send=intruder.send, close=intruder.close)
            assert isinstance(caught.value, ValueError)
            await reg.send_event("s", {"n": 4})
            assert intruder.frames == []
            assert wire.seqs() == [1, 2, 3, 4]
            assert reg.session_ids() == ["s"]


async def test_resume_rotates_replays_after_the_sequence_and_replaces_atomically() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            old = Wire()
            created = await reg.create("s", send=old.send, close=old.close)
            token = created.resume_token.plaintext
            for n in range(1, 5):
                await reg.send_event("s", {"n": n})
            new = Wire()
            result = await reg.resume(
                "s",
                resume_token=token,
                last_received_server_event_seq=2,
                send=new.send,
                close=new.close,
            )
            assert result.session_id == "s"
            assert result.attachment_generation == 2
            rotated = result.resume_token.plaintext
            assert rotated != token
            assert [e.sequence for e in result.replay_entries] == [3, 4]
            assert [dict(e.payload) for e in result.replay_entries] == [
                {"n": 3, "server_event_seq": 3},
                {"n": 4, "server_event_seq": 4},
            ]
            replaced = result.replaced_attachment
            assert replaced is not None
            assert replaced.generation == 1
            assert replaced.send == old.send
            assert replaced.close == old.close
            # Without an activation factory the caller sends the replay: the
            # library put nothing on the new wire, and closed nothing.
            assert new.frames == []
            assert old.closes == []
            assert await reg.is_current_attachment("s", 1) is False
            assert await reg.is_current_attachment("s", 2) is True
            await reg.send_event("s", {"n": 5})
            assert old.seqs() == [1, 2, 3, 4]
            assert new.seqs() == [5]
            assert await reg.detach("s", attachment_generation=1) is False
            with pytest.raises(InvalidResumeTokenError):
                await reg.authenticate_resume(
                    "s", resume_token=token, last_received_server_event_seq=4
                )
            await reg.authenticate_resume(
                "s", resume_token=rotated, last_received_server_event_seq=4
            )


async def test_resume_with_activation_hands_the_factory_the_rotated_token() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            await reg.send_event("s", {"n": 1})
            assert await reg.detach("s") is True
            catcher, wire = TokenCatcher(), Wire()
            result = await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=wire.send,
                close=wire.close,
                activation_payload_factory=catcher,
            )
            assert result.replaced_attachment is None
            assert [t.plaintext for t in catcher.tokens] == [result.resume_token.plaintext]
            assert wire.frames == [
                {"type": "session.resumed", "attachment_generation": 2},
                {"n": 1, "server_event_seq": 1},
            ]


async def test_a_detached_session_journals_without_sending() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            assert await reg.detach("s") is True
            assert await reg.has_attachment("s") is False
            accepted: list[str] = []
            entry = await reg.send_event(
                "s", {"n": 1}, on_accepted=lambda: accepted.append("journaled")
            )
            assert entry is not None
            assert entry.sequence == 1
            unjournaled = await reg.send_event(
                "s", {"audio": b"\x00\x01"}, journal=False, on_accepted=lambda: accepted.append("x")
            )
            assert unjournaled is None
            # The seed: a detached, unjournaled event invokes no on_accepted.
            assert accepted == ["journaled"]
            assert wire.frames == []
            assert await reg.detach("s") is False


async def test_acknowledge_trims_the_journal_and_checks_the_sequence() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            token = created.resume_token.plaintext
            for n in range(5):
                await reg.send_event("s", {"n": n})
            assert await reg.acknowledge("s", 3) == 3
            assert await reg.acknowledge("s", 3) == 0
            with pytest.raises(ValueError):
                await reg.acknowledge("s", 6)
            with pytest.raises(ValueError):
                await reg.acknowledge("s", -1)
            with pytest.raises(JournalGapError) as gap:
                await reg.authenticate_resume(
                    "s", resume_token=token, last_received_server_event_seq=2
                )
            assert isinstance(gap.value, RuntimeError)
            assert gap.value.reason == "acknowledged"
            result = await reg.resume(
                "s",
                resume_token=token,
                last_received_server_event_seq=3,
                send=Wire().send,
                close=Wire().close,
            )
            assert [e.sequence for e in result.replay_entries] == [4, 5]


async def test_token_is_checked_before_the_sequence() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            token = created.resume_token.plaintext
            await reg.send_event("s", {"n": 1})
            with pytest.raises(InvalidResumeTokenError):
                await reg.authenticate_resume(
                    "s", resume_token="not-the-token", last_received_server_event_seq=99
                )
            with pytest.raises(InvalidResumeTokenError):
                await reg.resume(
                    "s",
                    resume_token="not-the-token",
                    last_received_server_event_seq=99,
                    send=Wire().send,
                    close=Wire().close,
                )
            with pytest.raises(ValueError):
                await reg.authenticate_resume(
                    "s", resume_token=token, last_received_server_event_seq=2
                )
            with pytest.raises(ValueError):
                await reg.resume(
                    "s",
                    resume_token=token,
                    last_received_server_event_seq=2,
                    send=Wire().send,
                    close=Wire().close,
                )
            # Neither failure consumed the token, nor did authenticating.
            await reg.authenticate_resume("s", resume_token=token, last_received_server_event_seq=1)
            assert await reg.is_current_attachment("s", 1) is True
            result = await reg.resume(
                "s",
                resume_token=token,
                last_received_server_event_seq=1,
                send=Wire().send,
                close=Wire().close,
            )
            assert result.replay_entries == ()


async def test_ttl_pruned_by_a_sweep_makes_an_old_replay_a_gap() -> None:
    clock = FakeClock()
    with trio.fail_after(LIMIT):
        async with registry(clock=clock, replay_ttl_s=30.0) as reg:
            created = await reg.create("s", send=Wire().send, close=Wire().close)
            token = created.resume_token.plaintext
            await reg.send_event("s", {"n": 1})
            clock.now += 10
            await reg.send_event("s", {"n": 2})
            assert reg.stats().bytes_retained > 0
            before = reg.stats().bytes_retained
            clock.now += 25  # event 1 is 35 s old, event 2 15 s
            await reg.sweep()
            assert 0 < reg.stats().bytes_retained < before
            with pytest.raises(JournalGapError) as gap:
                await reg.authenticate_resume(
                    "s", resume_token=token, last_received_server_event_seq=0
                )
            assert gap.value.reason == "ttl"
            result = await reg.resume(
                "s",
                resume_token=token,
                last_received_server_event_seq=1,
                send=Wire().send,
                close=Wire().close,
            )
            assert [e.sequence for e in result.replay_entries] == [2]


async def test_overflow_is_sticky_and_makes_every_replay_a_gap() -> None:
    with trio.fail_after(LIMIT):
        async with registry(replay_max_bytes_per_session=200) as reg:
            wire = Wire()
            created = await reg.create("s", send=wire.send, close=wire.close)
            accepted: list[int] = []
            await reg.send_event("s", {"n": 1})
            with pytest.raises(JournalOverflowError) as caught:
                await reg.send_event(
                    "s", {"blob": "x" * 300}, on_accepted=lambda: accepted.append(1)
                )
            assert isinstance(caught.value, RuntimeError)
            with pytest.raises(JournalOverflowError):
                await reg.send_event("s", {"n": 2})
            assert accepted == []
            assert wire.seqs() == [1]
            with pytest.raises(JournalGapError):
                await reg.resume(
                    "s",
                    resume_token=created.resume_token.plaintext,
                    last_received_server_event_seq=1,
                    send=Wire().send,
                    close=Wire().close,
                )
            # Unjournaled events still flow.
            assert await reg.send_event("s", {"ping": 1}, journal=False) is None
            assert wire.frames[-1] == {"ping": 1}


async def test_sessions_and_their_journals_stay_isolated() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire_a, wire_b = Wire(), Wire()
            a = await reg.create("a", send=wire_a.send, close=wire_a.close)
            b = await reg.create("b", send=wire_b.send, close=wire_b.close)
            entries: list[JournalEntry | None] = []
            for n in range(3):
                entries.append(await reg.send_event("a", {"a": n}))
            entries.append(await reg.send_event("b", {"b": 0}))
            assert [e.sequence for e in entries if e is not None] == [1, 2, 3, 1]
            assert wire_a.frames == [{"a": n, "server_event_seq": n + 1} for n in range(3)]
            assert wire_b.frames == [{"b": 0, "server_event_seq": 1}]
            assert await reg.acknowledge("a", 3) == 3
            with pytest.raises(ValueError):
                await reg.acknowledge("b", 2)  # b's head is 1, whatever a's is
            with pytest.raises(InvalidResumeTokenError):
                await reg.resume(
                    "b",
                    resume_token=a.resume_token.plaintext,
                    last_received_server_event_seq=0,
                    send=Wire().send,
                    close=Wire().close,
                )
            assert await reg.detach("a") is True
            assert await reg.has_attachment("b") is True
            closed = await reg.close("a")
            assert closed is None  # a was detached
            assert sorted(reg.session_ids()) == ["b"]
            result = await reg.resume(
                "b",
                resume_token=b.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=wire_b.send,
                close=wire_b.close,
            )
            assert [dict(e.payload) for e in result.replay_entries] == [
                {"b": 0, "server_event_seq": 1}
            ]
            assert wire_a.closes == wire_b.closes == []


async def test_close_returns_the_attachment_and_forgets_the_session() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            await reg.send_event("s", {"n": 1})
            closed = await reg.close("s")
            assert closed is not None
            assert closed.generation == 1
            assert closed.send == wire.send
            # The seed's close only forgets: the caller closes the transport.
            assert wire.closes == []
            assert reg.session_ids() == []
            assert await reg.close("s") is None
            again = Wire()
            created = await reg.create("s", send=again.send, close=again.close)
            assert created.attachment_generation == 1
            entry = await reg.send_event("s", {"n": 1})
            assert entry is not None
            assert entry.sequence == 1
            assert wire.seqs() == [1]
            assert again.seqs() == [1]
