"""The engine message contract (supervisor.messages): round trips and refusals."""

from __future__ import annotations

import json

import pytest

from supervisor.messages import (
    MESSAGE_VERSION,
    CancelMessage,
    ClientEventMessage,
    EngineClose,
    EngineEvents,
    InputMessage,
    Message,
    MessageError,
    SessionNotice,
    decode,
    encode,
)

EXAMPLES: list[Message] = [
    SessionNotice(session_id="s1", lease_generation=3, kind="open", identity={"user": "ada"}),
    SessionNotice(session_id="s1", lease_generation=3, kind="detach"),
    InputMessage(session_id="s1", lease_generation=1, client_event_id="c1", text="héllo"),
    ClientEventMessage(
        session_id="s1",
        lease_generation=2,
        client_seq=7,
        type="input_audio.append",
        fields={"rate": 16000},
        data=b"\x00\x01\xff",
    ),
    ClientEventMessage(session_id="s1", lease_generation=2, client_seq=1, type="x.y"),
    CancelMessage(session_id="s1", lease_generation=2, response_id="resp_0"),
    EngineEvents(
        session_id="s1",
        lease_generation=2,
        message_id="1-0:0",
        payloads=({"type": "response.done", "client_event_id": "c1"},),
    ),
    EngineClose(session_id="s1", lease_generation=2, message_id="1-0:1", reason="done"),
]


@pytest.mark.parametrize("message", EXAMPLES, ids=lambda m: type(m).__name__)
def test_every_message_survives_a_round_trip(message: Message) -> None:
    raw = encode(message)
    body = json.loads(raw)
    assert body["v"] == MESSAGE_VERSION
    assert body["session_id"] == "s1"
    assert decode(raw) == message
    assert decode(raw.decode("utf-8")) == message


def test_messages_are_frozen_and_their_payloads_read_only() -> None:
    events = EngineEvents(
        session_id="s", lease_generation=1, message_id="k", payloads=({"type": "a"},)
    )
    with pytest.raises(AttributeError):
        events.message_id = "other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        events.payloads[0]["type"] = "b"  # type: ignore[index]
    assert isinstance(events.payloads, tuple)


def test_binary_data_travels_as_base64_and_stays_out_of_the_repr() -> None:
    message = ClientEventMessage(
        session_id="s", lease_generation=1, client_seq=1, type="t", data=b"secret-bytes"
    )
    assert "secret-bytes" not in repr(message)
    assert json.loads(encode(message))["data"] == "c2VjcmV0LWJ5dGVz"


def _body(**changes: object) -> bytes:
    body = json.loads(encode(EXAMPLES[2]))
    body.update(changes)
    return json.dumps({k: v for k, v in body.items() if v is not None}).encode()


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        (b"not json", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1, 2]", "not a JSON object"),
        (_body(v=2), "version 2"),
        (_body(v=None), "version None"),
        (_body(kind="gossip"), "unknown message kind 'gossip'"),
        (_body(session_id=None), "missing 'session_id'"),
        (_body(session_id=5), "'session_id' must be a string"),
        (_body(lease_generation=-1), "'lease_generation' must be an integer >= 0"),
        (_body(lease_generation=True), "'lease_generation' must be an integer"),
        (_body(text=None), "input message: missing 'text'"),
    ],
)
def test_bad_input_is_refused_with_a_clear_error(raw: bytes, says: str) -> None:
    with pytest.raises(MessageError, match=says.replace("(", r"\(")):
        decode(raw)


def test_kind_specific_fields_are_checked() -> None:
    notice = json.loads(encode(EXAMPLES[0]))
    with pytest.raises(MessageError, match="unknown notice 'reboot'"):
        decode(json.dumps({**notice, "notice": "reboot"}))
    event = json.loads(encode(EXAMPLES[3]))
    with pytest.raises(MessageError, match="'client_seq' must be an integer >= 1"):
        decode(json.dumps({**event, "client_seq": 0}))
    with pytest.raises(MessageError, match="'data' is not base64"):
        decode(json.dumps({**event, "data": "***"}))
    with pytest.raises(MessageError, match="'fields' must be an object"):
        decode(json.dumps({**event, "fields": []}))
    events = json.loads(encode(EXAMPLES[6]))
    with pytest.raises(MessageError, match="'payloads' must be a list of objects"):
        decode(json.dumps({**events, "payloads": [1]}))


def test_a_payload_that_is_not_json_is_refused_on_encode() -> None:
    events = EngineEvents(
        session_id="s", lease_generation=1, message_id="k", payloads=({"x": object()},)
    )
    with pytest.raises(MessageError, match="engine_events message is not JSON"):
        encode(events)


def test_the_error_is_one_of_ours_and_a_value_error() -> None:
    from actors._errors import SessionError

    assert issubclass(MessageError, SessionError)
    assert issubclass(MessageError, ValueError)


def test_the_contract_is_pure() -> None:
    import ast
    from pathlib import Path

    import supervisor.messages

    tree = ast.parse(Path(supervisor.messages.__file__).read_text())
    imported = {
        alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    } | {
        (node.module or "").split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
    }
    assert not imported & {"pykka", "trio", "asyncio", "threading", "anyio", "redis"}


def test_the_example_in_the_protocol_page_decodes() -> None:
    from pathlib import Path

    page = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    section = page.split("\n## Engine messages\n", 1)[1]
    block = section.split("```json\n", 1)[1].split("```", 1)[0]
    message = decode(block.strip())
    assert isinstance(message, EngineEvents)
    assert message.lease_generation == 2
    assert message.payloads[0]["type"] == "response.done"


def test_the_protocol_page_lists_every_kind() -> None:
    from pathlib import Path

    from supervisor.messages import _KINDS

    page = (Path(__file__).parent.parent / "docs" / "protocol.md").read_text()
    section = page.split("\n## Engine messages\n", 1)[1]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert {row.split("`")[1] for row in rows} == set(_KINDS.values())
