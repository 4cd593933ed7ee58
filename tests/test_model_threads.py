"""The model-based test through the blocking thread front door.

The same rules as ``test_model_trio.py``; the transports are blocking
callables. Transport faults are the wire's own (the thread door's outboxes do
not consult the FaultPlan's send faults, and have no send timeout to hang on).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import settings

from actors._errors import SessionCrashedError
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from supervisor._system import SessionSystem, SupervisorActor
from supervisor.doors._threads import ThreadSessionRegistry
from tests.helpers import ThreadReply
from tests.model_machine import RegistryMachine
from tests.model_support import (
    LIMIT,
    MAX_BYTES,
    PASSIVATE_AFTER_S,
    START,
    TTL,
    DoorCall,
    ModelWire,
    Observer,
)


class ThreadDoor:
    """A ThreadSessionRegistry, called straight from the test's thread."""

    def __init__(self, plan: FaultPlan, observer: Observer) -> None:
        self._registry = ThreadSessionRegistry(
            replay_ttl_s=TTL,
            replay_max_bytes_per_session=MAX_BYTES,
            clock=lambda: START,  # the plan's clock jumps move it
            faults=plan,
            observer=observer,
            restart_policy=RestartPolicy(max_restarts=10_000),
            passivate_after_s=PASSIVATE_AFTER_S,
            sweep_interval_s=None,  # sweeps only when a rule asks
            timeout=LIMIT,
        )

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._registry, method)(*args, **kwargs)

    def call_many(self, calls: Sequence[DoorCall]) -> list[Any]:
        results: list[Any] = [None] * len(calls)

        def one(i: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                results[i] = self.call(method, *args, **kwargs)
            except Exception as exc:
                results[i] = exc

        threads = [
            threading.Thread(target=one, args=(i, *call), name=f"model-call-{i}")
            for i, call in enumerate(calls)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(2 * LIMIT)
            assert not thread.is_alive(), "a concurrent call never returned"
        return results

    def transport(self, wire: ModelWire) -> tuple[Any, Any]:
        return wire.send_blocking, wire.close_blocking

    def session_ids(self) -> list[str]:
        return self._registry.session_ids()

    def shutdown(self) -> None:
        self._registry.shutdown()


class ThreadMachine(RegistryMachine):
    door_factory = ThreadDoor


TestThreadDoorAgainstTheModel = ThreadMachine.TestCase
TestThreadDoorAgainstTheModel.settings = settings(
    deadline=None, max_examples=150, stateful_step_count=50
)


@pytest.mark.parametrize("arrives_in", ["stop", "hand_over"])
def test_a_call_that_reaches_a_dying_supervisor_is_handed_over_not_lost(
    monkeypatch: pytest.MonkeyPatch, arrives_in: str
) -> None:
    """A supervisor that crashes answers its caller, then queues its own stop; a call
    that another thread sent in between used to be dropped with the supervisor's inbox
    (pykka discards a ``tell`` still queued behind a stop), so its caller waited forever.
    Found while building the machine's ``supervisor_crash`` steps: with a tiny GIL switch
    interval, about 1 in 700 "crash, then call again at once" rounds hung. Here the call
    lands exactly there (``stop``), or where the dying supervisor has closed its inbox
    but its successor is not started yet (``hand_over``)."""
    plan = FaultPlan()
    late = ThreadReply()
    owner: Any = SupervisorActor if arrives_in == "stop" else SessionSystem
    original = getattr(owner, arrives_in)
    registry = ThreadSessionRegistry(
        replay_ttl_s=TTL, replay_max_bytes_per_session=MAX_BYTES, faults=plan,
        sweep_interval_s=None, timeout=LIMIT,
    )  # fmt: skip

    def then_a_call_arrives(self: object, *args: Any) -> None:
        monkeypatch.setattr(owner, arrives_in, original)
        if arrives_in == "hand_over":
            registry.system.sweep(late)  # refused by the closed inbox: a successor starts
        original(self, *args)
        if arrives_in == "stop":
            registry.system.sweep(late)  # queued behind the stop, before the fix

    try:
        monkeypatch.setattr(owner, arrives_in, then_a_call_arrives)
        plan.crash_supervisor()
        with pytest.raises(SessionCrashedError):
            registry.sweep()
        assert late.wait(5.0) is None, "the late call was never answered"
        assert registry.close("nobody") is None  # and the successor routes
    finally:
        registry.shutdown()
