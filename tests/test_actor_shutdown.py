"""Shutdown leaves no thread of ours behind and refuses later calls."""

from __future__ import annotations

import threading

import pytest

from actors._errors import RegistryClosedError
from supervisor.doors._threads import ThreadSessionRegistry
from tests.actor_support import WAIT, Background, FakeClock, Wire


def _ours() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("duplex-")]


def test_shutdown_stops_every_actor_and_answers_callers() -> None:
    reg = ThreadSessionRegistry(
        replay_ttl_s=60, replay_max_bytes_per_session=1 << 20, clock=FakeClock(), timeout=WAIT
    )
    release = threading.Event()
    entered = threading.Event()

    def stuck_send(frame: dict[str, object]) -> None:
        entered.set()
        release.wait(WAIT)

    for n in range(5):
        wire = Wire()
        reg.create(f"s{n}", send=wire.send_blocking, close=wire.close_blocking)
        reg.send_event(f"s{n}", {"n": n})
    reg.create("stuck", send=stuck_send, close=lambda r: None)
    blocked = Background(lambda: reg.send_event("stuck", {"n": "x"}))
    assert entered.wait(WAIT)
    assert _ours() == ["duplex-loop"]  # the door's one loop thread runs every actor
    assert reg.stats().live == 6
    stopper = Background(reg.shutdown)
    with pytest.raises(RegistryClosedError):
        reg.send_event("s0", {"n": 1})
    with pytest.raises(RegistryClosedError):
        reg.create("new", send=Wire().send_blocking, close=lambda r: None)
    release.set()
    stopper.result()
    blocked.result()  # its frame went out once the send returned
    assert _ours() == []
    with pytest.raises(RegistryClosedError):
        reg.has_attachment("s1")
    with pytest.raises(RegistryClosedError):
        reg.send_event_nowait("s1", {"n": 1})
    with pytest.raises(RegistryClosedError):
        reg.close("s1")


def test_shutdown_answers_a_caller_queued_behind_a_busy_session() -> None:
    reg = ThreadSessionRegistry(
        replay_ttl_s=60, replay_max_bytes_per_session=1 << 20, clock=FakeClock(), timeout=WAIT
    )
    reg.create("s", send=Wire().send_blocking, close=lambda r: None)
    reg.shutdown()
    assert _ours() == []
    with pytest.raises(RegistryClosedError):
        reg.send_event("s", {"n": 1})
