"""The engine behind the gateway: the `Engine` protocol and a demo engine.

An engine is what streams events into sessions: a model, a tool runner, a
game. The gateway owns everything else (sessions, tokens, replay, dedupe,
throttles); an engine implements three methods::

    class Engine(Protocol):
        async def start(self, session: EngineSession) -> None: ...  # the session's life
        async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None: ...
        def stop(self, session_id: str) -> None: ...  # the session ended for good

``start`` runs in its own task from ``session.open`` until the session ends
(then it is cancelled; returning early is fine). ``answer`` runs in its own
task once per new input id (the gateway dedupes, caps inputs in flight and
for the session's life). ``session.send(payload)`` journals an event and
puts it on the client's wire if one is attached; it raises
`SessionEnded` once the session is over, which ends the calling task
quietly. ``session.send_many(payloads)`` does the same for several events in
one round trip (journaled all or none). A client that is slow or gone is the
gateway's trouble, not the engine's: the event is journaled and replayed on
resume.

Engines run on the serving loop (trio, or asyncio under uvicorn): write them
with ``anyio`` (or for the one loop you serve on).

`DemoEngine` streams ``response.output_text.delta`` events at a set
rate and answers each input with a few deltas and a ``response.done``, sent
as one batch (``session.send_many``).
"""

from __future__ import annotations

import importlib
import random
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import anyio

__all__ = [
    "DemoEngine",
    "Engine",
    "EngineConfig",
    "EngineSession",
    "SessionEnded",
    "load_callable",
    "load_engine_factory",
]

_WORDS = ("the", "quick", "resumable", "stream", "never", "drops", "an", "event", "again")


class SessionEnded(Exception):  # noqa: N818 - a signal to the engine's task, not a failure
    """The session is over (closed, expired, failed, overflowed): stop working on it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSession:
    """What an engine sees of one session: its id, the client's identity, ``send``."""

    session_id: str
    #: What the gateway's ``authenticate`` hook returned for the client (``None``: none).
    identity: object
    _send: Callable[[Mapping[str, object]], Awaitable[None]] = field(repr=False)
    _send_many: Callable[[Sequence[Mapping[str, object]]], Awaitable[None]] = field(repr=False)

    async def send(self, payload: Mapping[str, object]) -> None:
        """Journal ``payload`` as the session's next event and deliver it if attached.

        A payload is a mapping of JSON values (the registry is strict). Raises
        `SessionEnded` once the session is over.
        """
        await self._send(payload)

    async def send_many(self, payloads: Sequence[Mapping[str, object]]) -> None:
        """`send` for several events at once: one round trip to the session.

        Journaled all or none, with consecutive sequences, and delivered in
        order; what `send` raises, it raises. For events an engine has in
        hand together (a finished answer, a decode step's output).
        """
        await self._send_many(payloads)


@runtime_checkable
class Engine(Protocol):
    async def start(self, session: EngineSession) -> None: ...
    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None: ...
    def stop(self, session_id: str) -> None: ...


#: What ``serve --engine module:factory`` names: called with no arguments.
EngineFactory = Callable[[], Engine]


def load_callable(spec: str, flag: str) -> Callable[..., object]:
    """``"package.module:name"`` -> that callable; `ValueError` naming ``flag``
    and what is wrong."""
    module_name, sep, attribute = spec.partition(":")
    if not sep or not module_name or not attribute:
        raise ValueError(f"{flag} {spec!r}: expected module:name")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{flag} {spec!r}: cannot import {module_name!r}: {exc}") from None
    target: object = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{flag} {spec!r}: {module_name!r} has no {attribute!r}")
        target = getattr(target, part)
    if not callable(target):
        raise ValueError(f"{flag} {spec!r}: {attribute!r} is not callable")
    return target


def load_engine_factory(spec: str) -> EngineFactory:
    """``"package.module:factory"`` for ``serve --engine``."""
    factory: EngineFactory = load_callable(spec, "--engine")  # type: ignore[assignment]
    return factory


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """How fast and how much the demo engine talks."""

    event_rate_hz: float = 20.0
    delta_chars: int = 24
    deltas_per_answer: int = 3

    def __post_init__(self) -> None:
        if not self.event_rate_hz >= 0:
            raise ValueError("event_rate_hz must be >= 0 (0: answer inputs only)")
        if self.delta_chars < 1 or self.deltas_per_answer < 1:
            raise ValueError("delta_chars and deltas_per_answer must be >= 1")


class DemoEngine:
    """An `Engine`: what a realtime engine does to a session, minus the model."""

    def __init__(self, config: EngineConfig | None = None, *, seed: int | None = None) -> None:
        self.config = config or EngineConfig()
        self._random = random.Random(seed)  # noqa: S311 - demo text, not secrets
        self._responses: dict[str, int] = {}
        self.events_produced = 0

    def _delta(self) -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < self.config.delta_chars:
            words.append(self._random.choice(_WORDS))
        return " ".join(words)[: self.config.delta_chars]

    async def _send(self, session: EngineSession, payload: Mapping[str, object]) -> None:
        await session.send(payload)
        self.events_produced += 1

    async def start(self, session: EngineSession) -> None:
        if self.config.event_rate_hz <= 0:
            return
        period = 1 / self.config.event_rate_hz
        while True:
            await anyio.sleep(period)
            await self._send(
                session, {"type": "response.output_text.delta", "delta": self._delta()}
            )

    async def answer(self, session: EngineSession, client_event_id: str, text: str) -> None:
        number = self._responses.get(session.session_id, 0)
        self._responses[session.session_id] = number + 1
        response_id = f"resp_{number}"
        answer: list[Mapping[str, object]] = [
            {
                "type": "response.output_text.delta",
                "response_id": response_id,
                "delta": self._delta(),
            }
            for _ in range(self.config.deltas_per_answer)
        ]
        answer.append(
            {
                "type": "response.done",
                "response_id": response_id,
                "client_event_id": client_event_id,
                "input_chars": len(text),
            }
        )
        # The whole answer is in hand at once: one batch, one round trip.
        await session.send_many(answer)
        self.events_produced += len(answer)

    def stop(self, session_id: str) -> None:
        self._responses.pop(session_id, None)
