"""A resume queued behind an activation in flight sees its outcome."""

from __future__ import annotations

import threading

import pytest

from actors._errors import InvalidResumeTokenError
from supervisor.doors._threads import ThreadSessionRegistry
from tests.actor_support import WAIT, Background, Wire, activation, registry


class GatedSend:
    """A send that blocks on its first frame until released, then fails or not."""

    def __init__(self, *, fail: bool) -> None:
        self.fail = fail
        self.entered = threading.Event()
        self.release = threading.Event()
        self.frames: list[dict[str, object]] = []

    def __call__(self, frame: dict[str, object]) -> None:
        if not self.entered.is_set():
            self.entered.set()
            assert self.release.wait(WAIT)
            if self.fail:
                raise ConnectionError("activation frame lost")
        self.frames.append(frame)


def _queued_resume(reg: ThreadSessionRegistry, token: str, gate: GatedSend) -> Background:
    first = Background(
        lambda: reg.resume(
            "s",
            resume_token=token,
            last_received_server_event_seq=0,
            send=gate,
            close=lambda r: None,
            activation_payload_factory=activation,
        )
    )
    assert gate.entered.wait(WAIT)
    return first


def _second(reg: ThreadSessionRegistry, token: str, wire: Wire) -> Background:
    return Background(
        lambda: reg.resume(
            "s",
            resume_token=token,
            last_received_server_event_seq=0,
            send=wire.send_blocking,
            close=wire.close_blocking,
            activation_payload_factory=activation,
        )
    )


def test_resume_behind_a_failing_activation_recovers_with_the_presented_token() -> None:
    with registry() as reg:
        created = reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        token = created.resume_token.plaintext
        reg.send_event("s", {"n": 1})
        reg.detach("s")
        gate = GatedSend(fail=True)
        first = _queued_resume(reg, token, gate)
        wire = Wire()
        second = _second(reg, token, wire)
        # The second is stashed behind the activation: no answer yet.
        assert reg.has_attachment("s") is True
        assert list(wire.frames) == []
        gate.release.set()
        with pytest.raises(ConnectionError):
            first.result()
        result = second.result()
        assert result.attachment_generation == 3
        assert wire.frames[0] == {"type": "resumed", "generation": 3}
        assert wire.sequences() == [1]
        assert reg.is_current_attachment("s", 3) is True


def test_resume_behind_a_succeeding_activation_is_refused_with_the_old_token() -> None:
    with registry() as reg:
        created = reg.create("s", send=Wire().send_blocking, close=lambda r: None)
        token = created.resume_token.plaintext
        reg.send_event("s", {"n": 1})
        reg.detach("s")
        gate = GatedSend(fail=False)
        first = _queued_resume(reg, token, gate)
        wire = Wire()
        second = _second(reg, token, wire)
        assert list(wire.frames) == []
        gate.release.set()
        result = first.result()
        assert result.attachment_generation == 2
        with pytest.raises(InvalidResumeTokenError):
            second.result()
        assert list(wire.frames) == []
        assert reg.is_current_attachment("s", 2) is True
        assert gate.frames[0] == {"type": "resumed", "generation": 2}


def test_abandon_resume_rolls_back_only_the_current_generation() -> None:
    with registry() as reg:
        wire = Wire()
        created = reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        presented = created.resume_token.plaintext
        resumed = reg.resume(
            "s",
            resume_token=presented,
            last_received_server_event_seq=0,
            send=wire.send_blocking,
            close=wire.close_blocking,
        )
        assert reg.abandon_resume("s", attachment_generation=1) is False
        assert reg.has_attachment("s") is True
        assert reg.abandon_resume("s", attachment_generation=2) is True
        assert reg.has_attachment("s") is False
        # Both tokens get in now: the presented one once, the rotated one as usual.
        reg.authenticate_resume("s", resume_token=presented, last_received_server_event_seq=0)
        reg.authenticate_resume(
            "s", resume_token=resumed.resume_token.plaintext, last_received_server_event_seq=0
        )
        with pytest.raises(KeyError):
            reg.abandon_resume("nope", attachment_generation=1)
