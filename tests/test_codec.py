"""The JSON codec: every message round-trips; tokens live only inside the dict."""

from __future__ import annotations

import json
import traceback
from types import MappingProxyType
from typing import Any

import pytest

from actors import _commands as m
from actors._credential import ResumeToken
from actors._errors import InvalidInputError
from actors._journal import JournalEntry
from tests.helpers import (
    activation_payload,
    auth,
    make_journal,
    open_world,
    resume_command,
    wire_close,
    wire_send,
)
from tests.message_codec import CodecError, from_dict, message_types, to_dict


def on_accepted() -> None:
    return None


TOKEN = ResumeToken.generate()
PRESENTED = ResumeToken.generate().plaintext
_journal = make_journal()
ENTRIES: tuple[JournalEntry, ...] = (
    _journal.record({"text": "héllo", "n": 1.5}),
    _journal.record({"nested": {"list": [1, None, True]}}),
)
REPLACED = m.TransportAttachment(generation=1, send=wire_send, close=wire_close)
EVENT = m.LifecycleEvent(
    kind="resumed", session_id="s1", attachment_generation=2, lease_generation=3, reason="r"
)

# (sample, bindings for its local fields)
SAMPLES: list[tuple[object, dict[str, Any]]] = [
    (REPLACED, {"send": wire_send, "close": wire_close}),
    (m.SessionCreated(session_id="s1", attachment_generation=1, resume_token=TOKEN), {}),
    (m.DetachedAttachment(session_id="s1", attachment_generation=2, lease_generation=5), {}),
    (
        m.ResumeResult(
            session_id="s1",
            attachment_generation=2,
            resume_token=TOKEN,
            replay_entries=ENTRIES,
            replaced_attachment=REPLACED,
        ),
        {"replaced_attachment": REPLACED},
    ),
    (m.ResumeResult(session_id="s1", attachment_generation=3, resume_token=TOKEN), {}),
    (m.TickResult(pruned=2, expired=True), {}),
    (
        m.SendEvent(payload={"a": [1, "é"]}, journal=False, on_accepted=on_accepted),
        {"on_accepted": on_accepted},
    ),
    (m.SendEvent(payload={"a": 1}), {}),
    (m.SendEvents(payloads=({"a": 1}, {"b": {"c": 2}}), journal=True), {}),
    (m.Acknowledge(sequence=3), {}),
    (m.ReleaseAttachment(), {}),
    (m.ReleaseAttachment(attachment_generation=2), {}),
    (m.BeginResume(), {}),
    (m.EndResume(), {}),
    (m.SettleLeaseGeneration(lease_generation=4), {}),
    (m.HasAttachment(), {}),
    (m.IsCurrentAttachment(attachment_generation=2), {}),
    (m.AuthenticateResume(resume_token=PRESENTED, last_received_server_event_seq=7), {}),
    (
        m.Resume(
            resume_token=PRESENTED,
            last_received_server_event_seq=7,
            send=wire_send,
            close=wire_close,
            activation_payload_factory=activation_payload,
            lease_generation=3,
        ),
        {"send": wire_send, "close": wire_close, "activation_payload_factory": activation_payload},
    ),
    (m.ActivationOutcome(attachment_generation=2, delivered=False), {}),
    (m.AbortResume(attachment_generation=2), {}),
    (m.Tick(now=12.5), {}),
    (m.Close(), {}),
    (EVENT, {}),
    (m.EventAccepted(callback=on_accepted), {"callback": on_accepted}),
    (
        m.Deliver(
            attachment_generation=2,
            frames=(MappingProxyType({"server_event_seq": 1}), {"raw": "x"}),
            awaited=False,
            on_delivered=on_accepted,
        ),
        {"on_delivered": on_accepted},
    ),
    (
        m.Activate(
            attachment_generation=2,
            resume_token=TOKEN,
            payload_factory=activation_payload,
            replay=ENTRIES,
        ),
        {"payload_factory": activation_payload},
    ),
    (m.RetireAttachment(attachment_generation=1, reason="replaced"), {}),
    (m.Notify(event=EVENT), {}),
]


def sample_id(sample: tuple[object, dict[str, Any]]) -> str:
    return type(sample[0]).__name__


def through_json(message: object) -> Any:
    return json.loads(json.dumps(to_dict(message), allow_nan=False))


def test_samples_cover_every_type_the_codec_knows() -> None:
    names = {to_dict(sample)["type"] for sample, _ in SAMPLES}
    assert names == set(message_types())
    assert len(message_types()) == 26


@pytest.mark.parametrize(("message", "bindings"), SAMPLES, ids=[sample_id(s) for s in SAMPLES])
def test_round_trip_through_json_gives_an_equal_message(
    message: object, bindings: dict[str, Any]
) -> None:
    decoded = from_dict(through_json(message), **bindings)
    assert type(decoded) is type(message)
    assert decoded == message
    for name, bound in bindings.items():
        assert getattr(decoded, name) is bound


@pytest.mark.parametrize(("message", "bindings"), SAMPLES, ids=[sample_id(s) for s in SAMPLES])
def test_local_callables_are_never_encoded(message: object, bindings: dict[str, Any]) -> None:
    encoded = to_dict(message)
    local = {name for name in bindings if name != "replaced_attachment"}
    assert local.isdisjoint(encoded)
    json.dumps(encoded, allow_nan=False)  # nothing but JSON values


def test_resume_result_replay_entries_decode_as_journal_entries() -> None:
    result = SAMPLES[3][0]
    decoded = from_dict(through_json(result), replaced_attachment=REPLACED)
    assert [type(entry) for entry in decoded.replay_entries] == [JournalEntry, JournalEntry]
    assert [dict(e.payload) for e in decoded.replay_entries] == [dict(e.payload) for e in ENTRIES]
    assert decoded.replaced_attachment is REPLACED


def test_resume_result_with_a_replaced_attachment_needs_its_binding() -> None:
    with pytest.raises(CodecError, match="TransportAttachment"):
        from_dict(through_json(SAMPLES[3][0]))


TOKEN_CARRIERS = [
    (message, bindings)
    for message, bindings in SAMPLES
    if isinstance(
        message, m.SessionCreated | m.ResumeResult | m.Activate | m.AuthenticateResume | m.Resume
    )
]


@pytest.mark.parametrize(
    ("message", "bindings"), TOKEN_CARRIERS, ids=[sample_id(s) for s in TOKEN_CARRIERS]
)
def test_tokens_appear_only_inside_the_dict(message: object, bindings: dict[str, Any]) -> None:
    secret = PRESENTED if isinstance(message, m.AuthenticateResume | m.Resume) else TOKEN.plaintext
    assert secret in json.dumps(to_dict(message))
    decoded = from_dict(through_json(message), **bindings)
    for shown in (repr(message), str(message), repr(decoded), str(decoded)):
        assert secret not in shown
    assert type(message).__name__ in repr(message)


def test_decoded_result_token_is_a_redacted_resume_token() -> None:
    decoded = from_dict(through_json(SAMPLES[1][0]))
    assert isinstance(decoded.resume_token, ResumeToken)
    assert decoded.resume_token.plaintext == TOKEN.plaintext


@pytest.mark.parametrize(
    ("data", "bindings"),
    [
        ({"type": "resume", "resume_token": PRESENTED, "last_received_server_event_seq": 1}, {}),
        ({"type": "no_such_message", "resume_token": PRESENTED}, {}),
        ({"type": "authenticate_resume", "resume_token": PRESENTED}, {}),
        ({"type": "has_attachment"}, {"unexpected": PRESENTED}),
        ([PRESENTED], {}),
    ],
    ids=["missing-bindings", "unknown-type", "missing-field", "stray-binding", "not-an-object"],
)
def test_decode_errors_never_quote_the_token(data: Any, bindings: dict[str, Any]) -> None:
    with pytest.raises(CodecError) as info:
        from_dict(data, **bindings)
    assert isinstance(info.value, InvalidInputError)
    text = "".join(traceback.format_exception(info.value))
    assert PRESENTED not in text


def test_to_dict_refuses_what_is_not_a_message() -> None:
    with pytest.raises(CodecError, match="not an encodable message: dict"):
        to_dict({"type": "close"})


def test_no_transition_error_or_state_of_a_session_shows_a_token() -> None:
    world = open_world()
    issued = [world.token]
    shown: list[object] = [world.state, world.state.snapshot()]

    def run(command: m.Command) -> Any:
        transition = world.state.handle(command)
        shown.extend([transition, transition.reply, *transition.effects])
        error: BaseException | None = transition.error
        while error is not None:
            shown.append(error)
            error = error.__cause__ or error.__context__
        return transition.reply

    run(m.SendEvent(payload={"n": 1}))
    reply = run(resume_command(world, activation_payload_factory=activation_payload))
    issued.append(reply.resume_token.plaintext)
    run(m.ActivationOutcome(attachment_generation=2, delivered=False))
    run(resume_command(world, issued[1][::-1]))  # a wrong token
    run(resume_command(world, issued[0], last_received_server_event_seq=9))  # right token, bad seq
    reply = run(resume_command(world, issued[0]))
    issued.append(reply.resume_token.plaintext)
    shown.append(auth(world, issued[0], 0).error)
    run(m.Close())
    shown.extend([world.state, world.state.snapshot()])
    texts = [repr(item) for item in shown] + [str(item) for item in shown]
    for token in issued:
        assert not any(token in text for text in texts)
    assert any("invalid resume token" in text for text in texts)
