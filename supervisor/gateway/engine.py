"""A demo engine: what a realtime engine does to a session, minus the model.

Per session a producer task streams ``response.output_text.delta`` events at
a set rate while the session lives, attached or not (a detached session's
events are journaled and replayed: that is the point), and each ``input`` is
answered with a few deltas and a ``response.done``, once per
``client_event_id``. Everything goes through the registry, as a real engine
would send it.

Only the session's end stops its work (closed, expired, failed, an overflowed
journal, the registry shut down). A send that fails or times out is the
transport's trouble: the event is journaled, the attachment given up by the
registry, and a resume replays it; the stream and the answers go on.

Dedupe is exact for the session's lifetime: every answered id is remembered
(as a 16-byte digest) until the session ends, so a repeat is never answered
twice. The bound is stated: past ``max_inputs_per_session`` distinct ids a new
id is refused (``input_limit``), never answered.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import trio

from actors.errors import (
    JournalOverflowError,
    RegistryClosedError,
    SessionCrashedError,
    SessionFailedError,
)
from supervisor.async_door import AsyncSessionRegistry

__all__ = ["Answer", "DemoEngine", "EngineConfig"]

logger = logging.getLogger("duplex_supervisor.supervisor")

_WORDS = ("the", "quick", "resumable", "stream", "never", "drops", "an", "event", "again")

#: What :meth:`DemoEngine.answer` did with an input.
Answer = Literal["answered", "duplicate", "busy", "input_limit", "gone"]

#: Errors of ``send_event`` that mean the session is over for good.
_SESSION_ENDED = (KeyError, SessionFailedError, RegistryClosedError)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """How fast and how much the demo engine talks."""

    event_rate_hz: float = 20.0
    delta_chars: int = 24
    deltas_per_answer: int = 3
    #: Distinct input ids a session answers in its lifetime; past it, ``input_limit``.
    max_inputs_per_session: int = 100_000

    def __post_init__(self) -> None:
        if not self.event_rate_hz >= 0:
            raise ValueError("event_rate_hz must be >= 0 (0: answer inputs only)")
        if self.delta_chars < 1 or self.deltas_per_answer < 1:
            raise ValueError("delta_chars and deltas_per_answer must be >= 1")
        if self.max_inputs_per_session < 1:
            raise ValueError("max_inputs_per_session must be >= 1")


@dataclass(slots=True)
class _EngineSession:
    scope: trio.CancelScope
    answered: set[bytes] = field(default_factory=set)
    in_flight: int = 0
    responses: itertools.count[int] = field(default_factory=itertools.count)


def _digest(client_event_id: str) -> bytes:
    return hashlib.blake2b(client_event_id.encode("utf-8"), digest_size=16).digest()


class DemoEngine:
    """Streams events into sessions of ``registry``; runs its tasks in ``nursery``."""

    def __init__(
        self,
        registry: AsyncSessionRegistry,
        nursery: trio.Nursery,
        config: EngineConfig | None = None,
        *,
        on_overflow: Callable[[str], None] | None = None,
        seed: int | None = None,
    ) -> None:
        self._registry = registry
        self._nursery = nursery
        self._config = config or EngineConfig()
        self._on_overflow = on_overflow
        self._random = random.Random(seed)  # noqa: S311 - demo text, not secrets
        self._sessions: dict[str, _EngineSession] = {}
        self.events_produced = 0

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._sessions

    def start(self, session_id: str) -> None:
        scope = trio.CancelScope()
        self._sessions[session_id] = _EngineSession(scope=scope)
        if self._config.event_rate_hz > 0:
            self._nursery.start_soon(self._produce, session_id, scope)

    def stop(self, session_id: str) -> None:
        session = self._sessions.pop(session_id, None)
        if session is not None:
            session.scope.cancel()

    def is_duplicate(self, session_id: str, client_event_id: str) -> bool:
        session = self._sessions.get(session_id)
        return session is not None and _digest(client_event_id) in session.answered

    def in_flight(self, session_id: str) -> int:
        session = self._sessions.get(session_id)
        return 0 if session is None else session.in_flight

    def answer(
        self, session_id: str, client_event_id: str, text: str, *, max_in_flight: int | None = None
    ) -> Answer:
        """Answer an input once per id for the session's lifetime.

        ``"duplicate"``: answered before, nothing sent; ``"busy"``: ``max_in_flight``
        answers are still being sent; ``"input_limit"``: the session answered
        its maximum of ids; ``"gone"``: no such session. Only ``"answered"``
        remembers the id: a refused input may be sent again.
        """
        session = self._sessions.get(session_id)
        if session is None:
            return "gone"
        digest = _digest(client_event_id)
        if digest in session.answered:
            return "duplicate"
        if len(session.answered) >= self._config.max_inputs_per_session:
            return "input_limit"
        if max_in_flight is not None and session.in_flight >= max_in_flight:
            return "busy"
        session.answered.add(digest)
        session.in_flight += 1
        response_id = f"resp_{next(session.responses)}"
        self._nursery.start_soon(
            self._respond, session, session_id, response_id, client_event_id, text
        )
        return "answered"

    def _delta(self) -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < self._config.delta_chars:
            words.append(self._random.choice(_WORDS))
        return " ".join(words)[: self._config.delta_chars]

    async def _send(self, session_id: str, payload: Mapping[str, object]) -> bool:
        try:
            await self._registry.send_event(session_id, payload)
        except SessionCrashedError:
            # Retryable and traceless: the crashed event was never journaled.
            return await self._send(session_id, payload)
        except JournalOverflowError:
            logger.warning("session %s overflowed its journal; the engine stops", session_id)
            self.stop(session_id)
            if self._on_overflow is not None:
                self._on_overflow(session_id)
            return False
        except _SESSION_ENDED:
            self.stop(session_id)
            return False
        except Exception:  # noqa: BLE001 - the transport's (a send timeout too): it is journaled
            return True
        self.events_produced += 1
        return True

    async def _produce(self, session_id: str, scope: trio.CancelScope) -> None:
        with scope:
            period = 1 / self._config.event_rate_hz
            while True:
                await trio.sleep(period)
                event = {"type": "response.output_text.delta", "delta": self._delta()}
                if not await self._send(session_id, event):
                    return

    async def _respond(
        self,
        session: _EngineSession,
        session_id: str,
        response_id: str,
        client_event_id: str,
        text: str,
    ) -> None:
        try:
            for _ in range(self._config.deltas_per_answer):
                delta = {
                    "type": "response.output_text.delta",
                    "response_id": response_id,
                    "delta": self._delta(),
                }
                if not await self._send(session_id, delta):
                    return
            done = {
                "type": "response.done",
                "response_id": response_id,
                "client_event_id": client_event_id,
                "input_chars": len(text),
            }
            await self._send(session_id, done)
        finally:
            session.in_flight -= 1
