"""The seed drop-in, end to end: a seed program that only changes its import line.

Everything here goes through `supervisor.compat` and real session actors;
expected values are the seed's (its messages, its lenient input, its unknown
session answers). Resumes are in ``test_compat_resume.py``, detach and leases in
``test_compat_attachment.py``.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

import pytest

import actors._commands
import actors._credential
import actors._errors
import actors._journal
from supervisor import compat
from supervisor.compat import (
    DuplexDetachedAttachment,
    DuplexSessionAttachmentCreated,
    DuplexSessionAttachmentRegistry,
    DuplexTransportAttachment,
    JournalEntry,
    ResumeToken,
)
from supervisor.doors._asyncio import AsyncioSessionRegistry
from tests.asyncio_support import FakeClock, Wire, run, seed_registry

#: The seed module's public names and the class of ours each must be (or subclass).
SEED_NAMES: dict[str, type] = {
    "DuplexEventJournal": actors._journal.EventJournal,
    "DuplexJournalGapError": actors._errors.JournalGapError,
    "DuplexJournalOverflowError": actors._errors.JournalOverflowError,
    "DuplexResumeCredential": actors._credential.ResumeCredential,
    "DuplexSessionAttachmentCreated": actors._commands.SessionCreated,
    "DuplexDetachedAttachment": actors._commands.DetachedAttachment,
    "DuplexSessionAttachmentRegistry": AsyncioSessionRegistry,
    "DuplexSessionResumeResult": actors._commands.ResumeResult,
    "DuplexTransportAttachment": actors._commands.TransportAttachment,
    "InvalidResumeTokenError": actors._errors.InvalidResumeTokenError,
    "JournalEntry": actors._journal.JournalEntry,
    "ResumeToken": actors._credential.ResumeToken,
}

#: The built-in base the seed's class had, where it had one.
SEED_BASES: dict[str, type[BaseException]] = {
    "DuplexJournalGapError": RuntimeError,
    "DuplexJournalOverflowError": RuntimeError,
    "InvalidResumeTokenError": RuntimeError,
}


@pytest.mark.parametrize("name", sorted(SEED_NAMES))
def test_every_seed_name_is_importable_and_ours(name: str) -> None:
    seed_class = getattr(compat, name)
    assert name in compat.__all__
    assert issubclass(seed_class, SEED_NAMES[name])
    assert issubclass(seed_class, SEED_BASES.get(name, object))
    assert issubclass(seed_class, actors._errors.SessionError) == (name in SEED_BASES)


def test_seed_result_classes_take_positional_fields_as_in_the_seed() -> None:
    # The seed's dataclasses were not keyword-only: seed programs may build them so.
    async def send(frame: dict[str, object]) -> None:
        return None

    async def close(reason: str) -> None:
        return None

    token = ResumeToken("t" * 43)
    attachment = DuplexTransportAttachment(1, send, close)
    assert (attachment.generation, attachment.send, attachment.close) == (1, send, close)
    assert DuplexDetachedAttachment("s1", 1, 7).lease_generation == 7
    assert DuplexSessionAttachmentCreated("s1", 1, token).resume_token is token
    result = compat.DuplexSessionResumeResult("s1", 2, token, (), attachment)
    assert result.replaced_attachment is attachment
    assert JournalEntry(1, 0.0, 3, {"a": 1}).payload == {"a": 1}


def test_constructor_checks_as_the_seed_and_binds_no_loop() -> None:
    with pytest.raises(ValueError, match=r"^replay_ttl_s must be positive$"):
        DuplexSessionAttachmentRegistry(replay_ttl_s=0, replay_max_bytes_per_session=10)
    with pytest.raises(ValueError, match=r"^replay_max_bytes_per_session must be positive$"):
        DuplexSessionAttachmentRegistry(replay_ttl_s=1, replay_max_bytes_per_session=0)
    # Built outside any loop, as a seed program may do at import time.
    reg = DuplexSessionAttachmentRegistry(replay_ttl_s=1, replay_max_bytes_per_session=10)
    assert repr(reg) == "DuplexSessionAttachmentRegistry(session_ids=[])"


def test_create_gives_generation_one_and_a_token_per_session() -> None:
    async def scenario() -> None:
        clock = FakeClock(now=42.0)
        async with seed_registry(clock=clock) as reg:
            one, two = Wire(), Wire()
            a = await reg.create("a", send=one.send, close=one.close)
            b = await reg.create("b", send=two.send, close=two.close)
            assert isinstance(a, DuplexSessionAttachmentCreated)
            assert (a.session_id, a.attachment_generation) == ("a", 1)
            assert isinstance(a.resume_token, ResumeToken)
            assert len(a.resume_token.plaintext) == 43
            assert a.resume_token.plaintext != b.resume_token.plaintext
            assert a.resume_token.plaintext not in repr(a) + str(a) + repr(reg)
            # Each session has its own journal and wire; the clock is the one given.
            entry_a = await reg.send_event("a", {"n": 1})
            entry_b = await reg.send_event("b", {"n": 1})
            assert entry_a is not None and entry_b is not None
            assert (entry_a.sequence, entry_b.sequence) == (1, 1)
            assert entry_a.created_monotonic == 42.0
            assert (one.seqs(), two.seqs()) == ([1], [1])

    run(scenario)


def test_duplicate_create_is_the_seeds_value_error_and_changes_nothing() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            first, second = Wire(), Wire()
            created = await reg.create("s1", send=first.send, close=first.close)
            with pytest.raises(ValueError) as info:
                await reg.create("s1", send=second.send, close=second.close)
            assert str(info.value) == "duplex attachment session already exists: s1"
            await reg.send_event("s1", {"n": 1})
            assert (first.seqs(), second.frames) == ([1], [])
            token = created.resume_token.plaintext
            await reg.authenticate_resume(
                "s1", resume_token=token, last_received_server_event_seq=0
            )

    run(scenario)


def test_journaled_send_stamps_the_sequence_and_accepts_before_the_send() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            log: list[str] = []
            wire = Wire(log)
            await reg.create("s1", send=wire.send, close=wire.close)
            payload = {"type": "delta", "text": "hi"}
            entry = await reg.send_event("s1", payload, on_accepted=lambda: log.append("accepted"))
            assert isinstance(entry, JournalEntry)
            assert entry.sequence == 1
            assert dict(entry.payload) == {"type": "delta", "text": "hi", "server_event_seq": 1}
            assert payload == {"type": "delta", "text": "hi"}
            assert wire.frames == [dict(entry.payload)]
            assert log == ["accepted", "send"]
            second = await reg.send_event("s1", {"type": "delta"})
            assert second is not None and second.sequence == 2

    run(scenario)


def test_unjournaled_send_accepts_after_the_send_and_not_while_detached() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            log: list[str] = []
            wire = Wire(log)
            await reg.create("s1", send=wire.send, close=wire.close)
            audio = {"type": "audio", "chunk": b"\x00\x01"}
            accepted = await reg.send_event(
                "s1", audio, journal=False, on_accepted=lambda: log.append("accepted")
            )
            assert accepted is None
            assert wire.frames == [audio]
            assert log == ["send", "accepted"]
            assert await reg.detach("s1")
            log.clear()
            silent = await reg.send_event(
                "s1", {"n": 1}, journal=False, on_accepted=lambda: log.append("accepted")
            )
            assert silent is None and log == []
            # Detached, a journaled event is still recorded and accepted, not sent.
            entry = await reg.send_event(
                "s1", {"n": 2}, on_accepted=lambda: log.append("journaled")
            )
            assert entry is not None and entry.sequence == 1
            assert log == ["journaled"] and len(wire.frames) == 1

    run(scenario)


@pytest.mark.parametrize("journal", [True, False])
def test_failed_send_gives_the_same_error_and_detach_still_answers_true(journal: bool) -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire = Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close, lease_generation=3)
            error = ConnectionResetError("peer went away")
            wire.fail(1, error)
            accepted: list[bool] = []
            with pytest.raises(ConnectionResetError) as info:
                await reg.send_event(
                    "s1", {"n": 1}, journal=journal, on_accepted=lambda: accepted.append(True)
                )
            assert info.value is error
            assert accepted == ([True] if journal else [])
            assert await reg.has_attachment("s1")  # the library closed nothing
            released = await reg.release_attachment("s1")
            assert released == DuplexDetachedAttachment(
                session_id="s1", attachment_generation=1, lease_generation=3
            )
            assert wire.closes == []
            result = await reg.resume(
                "s1",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=wire.send,
                close=wire.close,
            )
            # A journaled event stays accepted (replayable); an unjournaled one is gone.
            assert [e.sequence for e in result.replay_entries] == ([1] if journal else [])

    run(scenario)


def _seed_encoded_bytes(payload: Any, sequence: int) -> int:
    """The seed's measure of a journaled event, verbatim."""
    sequenced = dict(payload)
    sequenced["server_event_seq"] = sequence
    return len(json.dumps(sequenced, separators=(",", ":"), ensure_ascii=False).encode("utf-8"))


LENIENT_PAYLOADS: dict[str, Any] = {
    "nan": {"score": float("nan")},
    "infinity": {"score": float("inf")},
    "int_keys": {1: "one", "two": 2},
    "pairs": [("type", "delta"), ("text", "hi")],
}


@pytest.mark.parametrize("name", sorted(LENIENT_PAYLOADS))
def test_lenient_input_is_accepted_exactly_as_the_seed(name: str) -> None:
    payload = LENIENT_PAYLOADS[name]

    async def scenario() -> None:
        async with seed_registry() as reg:
            wire = Wire()
            created = await reg.create("s1", send=wire.send, close=wire.close)
            entry = await reg.send_event("s1", payload)
            assert entry is not None and entry.sequence == 1
            expected = {**dict(payload), "server_event_seq": 1}
            assert repr(dict(entry.payload)) == repr(expected)
            assert entry.encoded_bytes == _seed_encoded_bytes(payload, 1)
            assert await reg.send_event("s1", payload, journal=False) is None
            assert [repr(f) for f in wire.frames] == [repr(expected), repr(dict(payload))]
            assert await reg.detach("s1")
            result = await reg.resume(
                "s1",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=wire.send,
                close=wire.close,
            )
            assert [repr(dict(e.payload)) for e in result.replay_entries] == [repr(expected)]

    run(scenario)


def test_acknowledge_counts_and_raises_the_seeds_value_errors() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire = Wire()
            await reg.create("s1", send=wire.send, close=wire.close)
            for n in range(3):
                await reg.send_event("s1", {"n": n})
            assert await reg.acknowledge("s1", 0) == 0
            assert await reg.acknowledge("s1", 2) == 2
            assert await reg.acknowledge("s1", 2) == 0
            with pytest.raises(ValueError) as negative:
                await reg.acknowledge("s1", -1)
            assert str(negative.value) == "acknowledged sequence must not be negative"
            with pytest.raises(ValueError) as newer:
                await reg.acknowledge("s1", 4)
            assert str(newer.value) == "acknowledged sequence 4 is newer than journal head 3"
            assert await reg.acknowledge("s1", 3) == 1

    run(scenario)


#: Per method: the arguments after the session id, and the seed's answer
#: for an unknown session (``KeyError`` where it raised one).
UNKNOWN: dict[str, tuple[tuple[Any, ...], Mapping[str, Any], object]] = {
    "send_event": (({"n": 1},), {}, KeyError),
    "acknowledge": ((0,), {}, KeyError),
    "begin_resume": ((), {}, KeyError),
    "authenticate_resume": (
        (),
        {"resume_token": "x", "last_received_server_event_seq": 0},
        KeyError,
    ),
    "resume": ((), {"resume_token": "x", "last_received_server_event_seq": 0}, KeyError),
    "detach": ((), {}, False),
    "release_attachment": ((), {}, None),
    "end_resume": ((), {}, None),
    "settle_lease_generation": ((3,), {}, None),
    "has_attachment": ((), {}, False),
    "is_current_attachment": ((1,), {}, False),
    "close": ((), {}, None),
}


@pytest.mark.parametrize("method", sorted(UNKNOWN))
def test_unknown_session_is_answered_per_method_as_the_seed(method: str) -> None:
    args, kwargs, expected = UNKNOWN[method]

    async def scenario() -> None:
        async with seed_registry() as reg:
            wire = Wire()
            await reg.create("known", send=wire.send, close=wire.close)
            extra = {"send": wire.send, "close": wire.close} if method == "resume" else {}
            call = getattr(reg, method)("nope", *args, **kwargs, **extra)
            if expected is KeyError:
                with pytest.raises(KeyError) as info:
                    await call
                assert info.value.args == ("unknown duplex attachment session: nope",)
            else:
                assert await call is expected
            assert wire.frames == []

    run(scenario)


def test_any_hashable_session_id_works_as_in_the_seed() -> None:
    # The seed keyed a dict by session id: ints, UUIDs and tuples all worked.
    ids: list[Any] = [7, uuid.UUID(int=3), ("room", 1)]

    async def scenario() -> None:
        async with seed_registry() as reg:
            wire = Wire()
            for session_id in ids:
                created = await reg.create(session_id, send=wire.send, close=wire.close)
                assert created.session_id == session_id
                entry = await reg.send_event(session_id, {"n": 1})
                assert entry is not None and entry.sequence == 1
                with pytest.raises(ValueError) as info:
                    await reg.create(session_id, send=wire.send, close=wire.close)
                assert str(info.value) == f"duplex attachment session already exists: {session_id}"
                assert await reg.detach(session_id) is True
            assert sorted(reg.session_ids(), key=repr) == sorted(ids, key=repr)
            assert reg.stats().sessions == 3

    run(scenario)


def test_close_returns_the_attachment_and_forgets_the_session() -> None:
    async def scenario() -> None:
        async with seed_registry() as reg:
            wire, other = Wire(), Wire()
            await reg.create("b", send=other.send, close=other.close)
            await reg.create("a", send=wire.send, close=wire.close)
            assert repr(reg) == "DuplexSessionAttachmentRegistry(session_ids=['a', 'b'])"
            attachment = await reg.close("a")
            assert isinstance(attachment, DuplexTransportAttachment)
            assert attachment.generation == 1
            assert (attachment.send, attachment.close) == (wire.send, wire.close)
            assert wire.closes == []  # closing the transport is the caller's job
            assert repr(reg) == "DuplexSessionAttachmentRegistry(session_ids=['b'])"
            assert await reg.close("a") is None
            with pytest.raises(KeyError):
                await reg.send_event("a", {"n": 1})
            again = await reg.create("a", send=wire.send, close=wire.close)
            assert again.attachment_generation == 1
            entry = await reg.send_event("a", {"n": 1})
            assert entry is not None and entry.sequence == 1
            # A detached session closes with no attachment to hand back.
            assert await reg.detach("b")
            assert await reg.close("b") is None
            assert repr(reg) == "DuplexSessionAttachmentRegistry(session_ids=['a'])"

    run(scenario)
