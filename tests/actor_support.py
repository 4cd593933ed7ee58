"""Shared helpers for the actor-layer tests (no tests here)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from actors._commands import LifecycleEvent
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.testing import FakeClock, Wire

WAIT = 5.0

__all__ = [
    "WAIT",
    "Background",
    "Events",
    "FakeClock",
    "GatedPlan",
    "Wire",
    "activation",
    "registry",
    "settle",
]


class GatedPlan(FaultPlan):
    """A FaultPlan that can also hold one failpoint until released."""

    def __init__(self) -> None:
        super().__init__()
        self._gate: tuple[str, str] | None = None
        self.reached = threading.Event()
        self.release = threading.Event()

    def gate(self, failpoint: str, session_id: str) -> None:
        self._gate = (failpoint, session_id)

    def hit(self, name: str, session_id: str) -> None:
        if self._gate == (name, session_id):
            self._gate = None
            self.reached.set()
            assert self.release.wait(WAIT), "gate never released"
        super().hit(name, session_id)


class Background:
    """Run ``fn`` on a thread; ``result()`` returns its value or raises its error."""

    def __init__(self, fn: Callable[[], Any], name: str = "test-bg") -> None:
        self._fn = fn
        self._done = threading.Event()
        self._value: Any = None
        self._error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()

    def finished_within(self, seconds: float) -> bool:
        return self._done.wait(seconds)

    def result(self, timeout: float = WAIT) -> Any:
        assert self._done.wait(timeout), "background call did not finish"
        if self._error is not None:
            raise self._error
        return self._value

    def error(self, timeout: float = WAIT) -> BaseException | None:
        assert self._done.wait(timeout), "background call did not finish"
        return self._error


class Events:
    """An observer that records events and lets tests wait for a kind."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self.events: list[LifecycleEvent] = []

    def __call__(self, event: LifecycleEvent) -> None:
        with self._cond:
            self.events.append(event)
            self._cond.notify_all()

    def kinds(self, session_id: str | None = None) -> list[str]:
        with self._cond:
            return [e.kind for e in self.events if session_id is None or e.session_id == session_id]

    def wait_for(self, kind: str, session_id: str, timeout: float = WAIT) -> LifecycleEvent:
        def find() -> LifecycleEvent | None:
            for e in self.events:
                if e.kind == kind and e.session_id == session_id:
                    return e
            return None

        with self._cond:
            assert self._cond.wait_for(lambda: find() is not None, timeout), (
                f"no {kind} event for {session_id}: {self.events}"
            )
            found = find()
            assert found is not None
            return found


@contextmanager
def registry(
    *,
    clock: FakeClock | None = None,
    faults: FaultPlan | None = None,
    observer: Callable[[LifecycleEvent], None] | None = None,
    restart_policy: RestartPolicy | None = None,
    disconnect_grace_s: float | None = None,
    replay_ttl_s: float = 60.0,
    passivate_after_s: float | None = 30.0,
) -> Iterator[ThreadSessionRegistry]:
    reg = ThreadSessionRegistry(
        replay_ttl_s=replay_ttl_s,
        replay_max_bytes_per_session=1 << 20,
        clock=clock if clock is not None else FakeClock(),
        faults=faults,
        observer=observer,
        restart_policy=restart_policy,
        disconnect_grace_s=disconnect_grace_s,
        passivate_after_s=passivate_after_s,
        timeout=WAIT,
    )
    try:
        yield reg
    finally:
        reg.shutdown()


def activation(token: object, generation: int) -> dict[str, object]:
    return {"type": "resumed", "generation": generation}


def settle(reg: ThreadSessionRegistry, session_id: str) -> None:
    """Wait until a session that left is out of the supervisor's books.

    It tells the supervisor as it leaves; a close of an unknown id is a
    supervisor round trip behind that message.
    """
    assert reg.close("\x00barrier") is None
