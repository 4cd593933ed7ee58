"""Sequenced client events in the sans-I/O core, with plain calls and made-up
times: ``client_seq`` accepted once and in order, acks every N events or T
seconds, the stream limits (events and bytes a second), binary framing."""

from __future__ import annotations

import json

import pytest

from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._core import (
    ClientSequence,
    ConnectionCore,
    DeliverEvent,
    OpenRequested,
    SendThroughSession,
)
from supervisor.gateway._limits import ByteRate
from supervisor.gateway._protocol import (
    ClientEvent,
    Input,
    ProtocolError,
    binary_event,
    parse_binary_event,
    parse_client_frame,
)

CONFIG = GatewayConfig(client_ack_every=3, client_ack_interval_s=0.5)


def _open(config: GatewayConfig = CONFIG, **kw: object) -> ConnectionCore:
    core = ConnectionCore(config, 0.0, event_types=frozenset({"input_audio.append"}))
    actions = core.receive(json.dumps({"type": "session.open"}), 0.0)
    assert isinstance(actions[0], OpenRequested)
    core.admitted("s1", 1, resumed=False, now=0.0, last_client_seq=0)
    return core


def _audio(seq: int, data: bytes = b"\x00" * 640) -> bytes:
    return binary_event({"type": "input_audio.append", "client_seq": seq}, data)


def test_a_sequence_accepts_each_number_once_in_order() -> None:
    sequence = ClientSequence()
    assert [sequence.accept(n) for n in (1, 2, 2, 1, 4, 3)] == [
        "accepted",
        "accepted",
        "repeat",
        "repeat",
        "ahead",
        "accepted",
    ]
    assert (sequence.last, sequence.repeats) == (3, 2)


def test_a_binary_event_carries_its_header_and_raw_bytes() -> None:
    message = binary_event(
        {"type": "input_audio.append", "client_seq": 7, "rate": 16000}, b"\x01\x02"
    )
    event = parse_client_frame(message)
    assert event == ClientEvent(
        type="input_audio.append",
        client_seq=7,
        fields={"rate": 16000},
        data=b"\x01\x02",
        size=len(message),
    )


@pytest.mark.parametrize(
    "message",
    [
        b"\x00",  # shorter than the header's length
        b"\x00\x10{}",  # shorter than the header
        b"\x00\x02[]",  # not an object
        b"\x00\x02{}",  # no type
        binary_event({"type": "ack", "client_seq": 1}, b""),  # a control frame
        binary_event({"type": "input_audio.append"}, b""),  # no client_seq
        binary_event({"type": "input_audio.append", "client_seq": 0}, b""),
    ],
)
def test_a_malformed_binary_event_is_a_bad_request(message: bytes) -> None:
    with pytest.raises(ProtocolError) as raised:
        parse_binary_event(message)
    assert raised.value.code == "bad_request"


def test_an_input_without_client_seq_is_the_simple_mode() -> None:
    simple = parse_client_frame(json.dumps({"type": "input", "client_event_id": "a", "text": "x"}))
    assert simple == Input(client_event_id="a", text="x")
    sequenced = parse_client_frame(
        json.dumps({"type": "input", "client_event_id": "a", "text": "x", "client_seq": 1})
    )
    assert isinstance(sequenced, ClientEvent)
    assert sequenced.fields == {"client_event_id": "a", "text": "x"}


def test_a_client_event_goes_to_its_session_to_be_sequenced() -> None:
    core = _open()
    actions = core.receive(_audio(1), 0.0)
    assert len(actions) == 1
    assert isinstance(actions[0], DeliverEvent)
    assert actions[0].event.client_seq == 1


def test_an_undeclared_event_type_is_a_bad_request_that_keeps_the_connection() -> None:
    core = _open()
    actions = core.receive(json.dumps({"type": "tool.call", "client_seq": 1}), 0.0)
    assert len(actions) == 1
    assert isinstance(actions[0], SendThroughSession)
    assert (actions[0].frame["code"], actions[0].frame["client_seq"]) == ("bad_request", 1)


def test_a_jump_ahead_is_a_bad_request_naming_the_last_accepted() -> None:
    core = _open()
    event = parse_binary_event(_audio(5))
    actions = core.event_verdict(event, "ahead", 3, 0.0)
    assert len(actions) == 1
    assert isinstance(actions[0], SendThroughSession)
    frame = actions[0].frame
    assert (frame["code"], frame["client_seq"], frame["last_client_seq"]) == (
        "bad_request",
        5,
        3,
    )


def test_acks_go_out_every_n_accepted_events() -> None:
    core = _open()
    sent = []
    for seq in range(1, 8):
        sent += core.event_verdict(parse_binary_event(_audio(seq)), "accepted", seq, 0.0)
    assert sent == [
        SendThroughSession(frame={"type": "client_ack", "client_seq": 3}),
        SendThroughSession(frame={"type": "client_ack", "client_seq": 6}),
    ]


def test_an_ack_goes_out_after_the_interval_even_for_one_event() -> None:
    core = _open()
    assert core.event_verdict(parse_binary_event(_audio(1)), "accepted", 1, 1.0) == []
    assert core.next_deadline() == 1.5  # before the next ping (at 10)
    assert core.tick(1.4) == []
    assert core.tick(1.5) == [SendThroughSession(frame={"type": "client_ack", "client_seq": 1})]
    # Nothing new accepted: no further ack, only keepalive.
    assert core.next_deadline() == 10.0
    assert core.tick(5.0) == []


def test_a_repeat_is_acked_too_so_the_client_stops_resending() -> None:
    core = _open()
    core.admitted("s1", 2, resumed=True, now=0.0, last_client_seq=4)
    assert core.event_verdict(parse_binary_event(_audio(2)), "repeat", 4, 0.0) == []
    assert core.tick(0.5) == []  # the client was told 4 in session.resumed already


def test_the_default_stream_limits_are_100_events_and_64_kib_a_second() -> None:
    config = GatewayConfig()
    assert config.max_client_events_per_second == 100
    assert config.max_client_bytes_per_second == 65_536
    core = _open(config)
    # 50 chunks of 640 bytes a second for 10 seconds: all pass.
    for tick in range(500):
        now = tick * 0.02
        actions = core.receive(_audio(tick + 1), now)
        assert isinstance(actions[0], DeliverEvent), (tick, actions)


def test_past_the_event_rate_a_client_event_is_refused_with_its_client_seq() -> None:
    core = _open(GatewayConfig(max_client_events_per_second=5))
    verdicts = [core.receive(_audio(seq, b""), 0.0)[0] for seq in range(1, 8)]
    assert all(isinstance(v, DeliverEvent) for v in verdicts[:5])
    refused = verdicts[5]
    assert isinstance(refused, SendThroughSession)
    assert (refused.frame["code"], refused.frame["client_seq"]) == ("rate_limited", 6)


def test_past_the_byte_rate_a_client_event_is_refused() -> None:
    core = _open(GatewayConfig(max_client_bytes_per_second=4096))
    first = core.receive(_audio(1, b"\x00" * 3000), 0.0)[0]
    second = core.receive(_audio(2, b"\x00" * 3000), 0.0)[0]
    assert isinstance(first, DeliverEvent)
    assert isinstance(second, SendThroughSession)
    assert second.frame["code"] == "rate_limited"
    # A second later the bucket has room again.
    assert isinstance(core.receive(_audio(2, b"\x00" * 3000), 1.0)[0], DeliverEvent)


def test_a_byte_bucket_lets_one_message_over_its_burst_through_when_full() -> None:
    rate = ByteRate(1000)
    assert rate.allow(5000, 0.0)
    assert not rate.allow(1, 0.5)
    assert rate.allow(1, 5.0)
