"""docs/protocol.md cannot drift: its frame, error and close-code tables are
parsed and checked against the code's constants and parser."""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path

import pytest

from supervisor.gateway._admission import _Activation
from supervisor.gateway._engine import DemoEngine
from supervisor.gateway._protocol import (
    BUILTIN_EVENT_TYPES,
    CLOSE_CODES,
    CONTROL_TYPES,
    NON_FATAL,
    REPLACED_CLOSE_CODE,
    SERVER_FRAME_TYPES,
    ClientEvent,
    ErrorCode,
    ProtocolError,
    parse_client_frame,
)
from supervisor.gateway._service import GOING_AWAY

DOC = Path(__file__).resolve().parent.parent / "docs" / "protocol.md"

#: The demo engine's server events (its own, not the gateway's).
DEMO_SERVER_EVENTS = {"response.output_text.delta", "response.done", "input_audio.received"}


def _table(heading: str) -> list[list[str]]:
    """The rows (cells, stripped) of the first table under ``## heading``."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert len(rows) > 2, f"no table under {heading!r}"
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def _names(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _frames(heading: str) -> dict[str, list[str]]:
    return {_names(row[0])[0]: _names(row[1]) for row in _table(heading)}


def test_every_client_frame_the_gateway_takes_is_in_the_table() -> None:
    documented = set(_frames("Client frames"))
    assert documented >= CONTROL_TYPES | BUILTIN_EVENT_TYPES
    # The rest are the demo engine's client events.
    assert documented - CONTROL_TYPES - BUILTIN_EVENT_TYPES <= DemoEngine.client_event_types


def _value(name: str) -> object:
    return 1 if name.endswith("seq") else "x"


@pytest.mark.parametrize("kind", sorted(_frames("Client frames")))
def test_each_client_frame_parses_with_its_fields_and_not_without_a_required_one(
    kind: str,
) -> None:
    fields = _frames("Client frames")[kind]
    required = [f for f in fields if not f.endswith("?")]
    optional = [f.rstrip("?") for f in fields if f.endswith("?")]
    frame = {"type": kind, **{name: _value(name) for name in required + optional}}
    parsed = parse_client_frame(json.dumps(frame))
    if kind not in CONTROL_TYPES or "client_seq" in frame:
        assert isinstance(parsed, ClientEvent)
    # A control frame needs each of its required fields; a client event its
    # client_seq (its other fields are the engine's to check).
    checked = required if kind in CONTROL_TYPES else ["client_seq"]
    for name in checked:
        without = {k: v for k, v in frame.items() if k != name}
        with pytest.raises(ProtocolError):
            parse_client_frame(json.dumps(without))


def test_every_server_frame_is_in_the_table() -> None:
    documented = set(_frames("Server frames"))
    assert documented == SERVER_FRAME_TYPES | DEMO_SERVER_EVENTS


def test_session_resumed_has_exactly_the_documented_fields() -> None:
    class _Token:
        plaintext = "t"

    frame = _Activation("s", 3).activation_payload(_Token(), 2, 5)  # type: ignore[arg-type]
    assert sorted(frame) == sorted(["type", *_frames("Server frames")["session.resumed"]])


def test_the_error_table_matches_every_code_its_close_code_and_fatality() -> None:
    rows = {_names(row[0])[0]: row for row in _table("Errors")}
    assert set(rows) == set(typing.get_args(ErrorCode))
    for code, row in rows.items():
        close, fatal = row[1], row[2]
        assert (int(close) if close else None) == CLOSE_CODES.get(code), code
        assert (fatal == "no") == (code in NON_FATAL), code


def test_the_close_code_table_names_the_gateways_own_codes() -> None:
    closes = {int(row[0]) for row in _table("Close codes")}
    assert {1000, GOING_AWAY, 1011, REPLACED_CLOSE_CODE} <= closes
    assert not closes & set(CLOSE_CODES.values())  # those are in the error table
