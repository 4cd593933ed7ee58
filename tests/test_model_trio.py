"""The model-based test through the trio front door.

The registry lives in ``trio.run`` on a background thread; each rule's calls
are submitted with ``trio.from_thread.run`` and waited for, so hypothesis
drives it step by step from its own thread.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import trio
from hypothesis import settings

from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from supervisor.doors._trio import TrioSessionRegistry, open_session_registry
from tests.model_machine import RegistryMachine
from tests.model_support import (
    LIMIT,
    MAX_BYTES,
    PASSIVATE_AFTER_S,
    SEND_TIMEOUT,
    START,
    TTL,
    DoorCall,
    ModelWire,
    Observer,
)


class TrioDoor:
    """A trio registry on its own thread, driven from the test's thread."""

    def __init__(self, plan: FaultPlan, observer: Observer) -> None:
        self._plan, self._observer = plan, observer
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._stop: trio.Event | None = None
        self._registry: TrioSessionRegistry | None = None
        self._thread = threading.Thread(target=self._run, name="model-trio", daemon=True)
        self._thread.start()
        assert self._ready.wait(LIMIT), "the trio registry did not start"
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
        finally:
            self._ready.set()

    async def _main(self) -> None:
        async with open_session_registry(
            replay_ttl_s=TTL,
            replay_max_bytes_per_session=MAX_BYTES,
            clock=lambda: START,  # the plan's clock jumps move it
            faults=self._plan,
            observer=self._observer,
            restart_policy=RestartPolicy(max_restarts=10_000),
            passivate_after_s=PASSIVATE_AFTER_S,
            sweep_interval_s=None,  # sweeps only when a rule asks
            send_timeout_s=SEND_TIMEOUT,
        ) as registry:
            self._registry, self._stop = registry, trio.Event()
            self._token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        async def run() -> Any:
            with trio.fail_after(LIMIT):
                return await getattr(self._registry, method)(*args, **kwargs)

        return trio.from_thread.run(run, trio_token=self._token)

    def call_many(self, calls: Sequence[DoorCall]) -> list[Any]:
        results: list[Any] = [None] * len(calls)

        async def one(i: int, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            try:
                results[i] = await getattr(self._registry, method)(*args, **kwargs)
            except Exception as exc:
                results[i] = exc

        async def run() -> None:
            with trio.fail_after(LIMIT):
                async with trio.open_nursery() as nursery:
                    for i, (method, args, kwargs) in enumerate(calls):
                        nursery.start_soon(one, i, method, args, kwargs)

        trio.from_thread.run(run, trio_token=self._token)
        return results

    def transport(self, wire: ModelWire) -> tuple[Any, Any]:
        return wire.send, wire.close

    def session_ids(self) -> list[str]:
        assert self._registry is not None
        return trio.from_thread.run_sync(self._registry.session_ids, trio_token=self._token)

    def shutdown(self) -> None:
        if self._stop is not None and self._thread.is_alive():
            trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(3 * LIMIT)
        assert not self._thread.is_alive(), "the trio registry did not shut down"
        if self._error is not None:
            raise self._error


class TrioMachine(RegistryMachine):
    door_factory = TrioDoor
    SEND_FAULTS = ("wire_fail", "plan_fail", "plan_hang")
    ACTIVATIONS = ("ok", "factory_raises", "wire_fail", "plan_fail", "plan_hang")


TestTrioDoorAgainstTheModel = TrioMachine.TestCase
TestTrioDoorAgainstTheModel.settings = settings(
    deadline=None, max_examples=150, stateful_step_count=50
)
