"""The options every front door takes, in one place, validated once."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypedDict

from actors._commands import LifecycleEvent
from actors._ports import LoopPort
from actors._state import SessionConfig
from actors._store import SessionStore
from supervisor._faults import FaultPlan
from supervisor._policy import RestartPolicy
from supervisor._system import DEFAULT_PASSIVATE_AFTER_S, SessionSystem

__all__ = ["RegistryOptions", "RegistryOptionsDict"]


class _RequiredOptions(TypedDict):
    # A base of its own, not ``Required[...]``: under ``from __future__ import
    # annotations`` only the class's ``total`` tells the runtime what is required.
    replay_ttl_s: float
    replay_max_bytes_per_session: int


class RegistryOptionsDict(_RequiredOptions, total=False):
    """`RegistryOptions`'s fields as keyword arguments, for type checkers (PEP 692).

    The doors take ``**options: Unpack[RegistryOptionsDict]``, so an IDE
    shows every option and a type checker refuses a misspelled one; at run
    time `RegistryOptions` refuses it (``TypeError`` naming it). Kept equal to
    `RegistryOptions` field by field (a test compares them).
    """

    replay_max_events_per_session: int | None
    clock: Callable[[], float] | None
    disconnect_grace_s: float | None
    send_timeout_s: float | None
    restart_policy: RestartPolicy | None
    passivate_after_s: float | None
    faults: FaultPlan | None
    observer: Callable[[LifecycleEvent], None] | None
    sweep_interval_s: float | None
    max_pending_per_session: int
    strict: bool
    drain_timeout_s: float
    daemon_threads: bool
    store: SessionStore | None


@dataclass(frozen=True, slots=True, kw_only=True)
class RegistryOptions:
    """A registry's options: the keyword arguments of every front door.

    ``open_session_registry(**options)`` (trio and asyncio) and
    ``ThreadSessionRegistry(**options)`` build one of these, so every door
    takes the same names with the same defaults and refuses a bad value the
    same way (`ValueError`, before any thread starts).

    Attributes:
        replay_ttl_s: How long a journaled event stays replayable (seconds of
            ``clock``).
        replay_max_bytes_per_session: The journal's byte cap; past it the
            journal overflows (sticky), as in the seed.
        replay_max_events_per_session: An optional cap on journaled events.
        clock: The registry's clock (``time.monotonic`` if ``None``); tests
            pass a fake one and move it instead of sleeping.
        disconnect_grace_s: ``None``: the engine owns the grace, as in the
            seed. A number: a session left detached that long is closed.
        send_timeout_s: A transport ``send`` running longer makes the library
            give up on that transport: its outbox stops and its
            ``close("send_timeout")`` is called. ``None`` waits forever.
        restart_policy: What the supervisor decides when a session crashes
            (restart, backoff, close; registry-wide escalation).
        passivate_after_s: A session left detached and idle this long is
            parked (no thread; woken by its next message). ``None``: never.
        faults: A `FaultPlan` for fault-injection tests.
        observer: Called with every `LifecycleEvent`, on the
            registry's loop (the thread door: its loop thread). Must not block.
        sweep_interval_s: How often, in real time, TTLs and the disconnect
            grace are checked (``None``: only on ``sweep()``).
        max_pending_per_session: Calls in flight per session past which
            ``send_event_nowait`` refuses (the door's would-block error) and
            awaited calls wait their turn.
        strict: Strict input checks (JSON payloads, string session ids,
            int sequences). ``False`` takes what the seed took.
        drain_timeout_s: How long leaving the registry lets queued
            ``send_event_nowait`` calls and outboxes drain before it stops
            every session.
        daemon_threads: Accepted for compatibility; no effect. Actors have
            no threads any more: they run on the registry's loop.
        store: Where sessions persist beyond this process
            (`RedisStore`, or a shared
            `MemoryStore`). ``None``: this
            process's memory only, no write per event. See the README's
            "More than one process".
    """

    replay_ttl_s: float
    replay_max_bytes_per_session: int
    replay_max_events_per_session: int | None = None
    clock: Callable[[], float] | None = field(default=None, repr=False)
    disconnect_grace_s: float | None = None
    send_timeout_s: float | None = 10.0
    restart_policy: RestartPolicy | None = None
    passivate_after_s: float | None = DEFAULT_PASSIVATE_AFTER_S
    faults: FaultPlan | None = field(default=None, repr=False)
    observer: Callable[[LifecycleEvent], None] | None = field(default=None, repr=False)
    sweep_interval_s: float | None = 1.0
    max_pending_per_session: int = 10_000
    strict: bool = True
    drain_timeout_s: float = 2.0
    daemon_threads: bool = False
    store: SessionStore | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        # SessionConfig checks the journal's and the grace's numbers.
        self.session_config()
        if self.sweep_interval_s is not None and not self.sweep_interval_s > 0:
            raise ValueError("sweep_interval_s must be positive (or None: sweep() only)")
        if self.send_timeout_s is not None and not self.send_timeout_s > 0:
            raise ValueError("send_timeout_s must be positive (or None: no timeout)")
        if self.max_pending_per_session < 1:
            raise ValueError("max_pending_per_session must be >= 1")
        if not self.drain_timeout_s >= 0:
            raise ValueError("drain_timeout_s must be >= 0")
        if self.passivate_after_s is not None and not self.passivate_after_s >= 0:
            raise ValueError("passivate_after_s must be None or >= 0")

    def session_config(self) -> SessionConfig:
        """The per-session limits every session of the registry shares."""
        return SessionConfig(
            replay_ttl_s=self.replay_ttl_s,
            replay_max_bytes=self.replay_max_bytes_per_session,
            replay_max_events=self.replay_max_events_per_session,
            disconnect_grace_s=self.disconnect_grace_s,
            strict=self.strict,
        )

    def start_system(self, port: LoopPort) -> SessionSystem:
        """Start the registry's supervisor; callbacks reach the loop through ``port``."""
        return SessionSystem(
            config=self.session_config(),
            clock=self.clock or time.monotonic,
            port=port,
            restart_policy=self.restart_policy,
            passivate_after_s=self.passivate_after_s,
            faults=self.faults,
            observer=self.observer,
            store=self.store,
        )
