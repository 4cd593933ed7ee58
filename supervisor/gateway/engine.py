"""A demo engine: what a realtime engine does to a session, minus the model.

Per session a producer task streams ``response.output_text.delta`` events at
a set rate while the session lives, attached or not (a detached session's
events are journaled and replayed: that is the point), and each ``input`` is
answered with a few deltas and a ``response.done``, once per
``client_event_id``. Everything goes through the registry, as a real engine
would send it.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import trio

from actors.errors import JournalOverflowError, SessionCrashedError, SessionError
from supervisor.async_door import AsyncSessionRegistry

__all__ = ["DemoEngine", "EngineConfig"]

logger = logging.getLogger("duplex_supervisor.supervisor")

_WORDS = ("the", "quick", "resumable", "stream", "never", "drops", "an", "event", "again")

#: How many input ids a session remembers for deduplication.
_REMEMBERED_INPUTS = 4096


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


@dataclass(slots=True)
class _EngineSession:
    scope: trio.CancelScope
    answered: set[str] = field(default_factory=set)
    order: deque[str] = field(default_factory=deque)
    responses: itertools.count[int] = field(default_factory=itertools.count)


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
        return session is not None and client_event_id in session.answered

    def answer(self, session_id: str, client_event_id: str, text: str) -> bool:
        """Answer an input once; ``False`` (and nothing sent) for a repeated id."""
        session = self._sessions.get(session_id)
        if session is None or client_event_id in session.answered:
            return False
        session.answered.add(client_event_id)
        session.order.append(client_event_id)
        if len(session.order) > _REMEMBERED_INPUTS:
            session.answered.discard(session.order.popleft())
        response_id = f"resp_{next(session.responses)}"
        self._nursery.start_soon(self._respond, session_id, response_id, client_event_id, text)
        return True

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
        except (KeyError, SessionError):
            self.stop(session_id)
            return False
        except Exception:  # noqa: BLE001 - a send error is the transport's; the event is journaled
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
        self, session_id: str, response_id: str, client_event_id: str, text: str
    ) -> None:
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
