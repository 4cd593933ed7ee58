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

For realtime work an engine may also declare ``client_event_types`` (a set
of client event types it takes, e.g. ``{"input_audio.append"}``) and an
``async def on_client_event(session, event)``: each sequenced client event
of those types reaches it exactly once, in ``client_seq`` order, as a
`ClientEvent` (its fields, and ``data``: the bytes of a binary event). What
``EngineSession`` offers besides ``send``: ``attached`` with
``wait_attached()``/``wait_detached()`` (pause while nobody listens),
``acked_server_event_seq`` and ``last_client_seq``, ``cancellable(id)``
(a scope a client's ``response.cancel {response_id: id}`` cancels: barge-in;
an input's answer is one under its ``client_event_id``) and ``close(reason)``.
docs/api.md has an example of each.

`DemoEngine` streams ``response.output_text.delta`` events at a set
rate, answers each input with a few deltas and a ``response.done``, sent
as one batch (``session.send_many``), and each ``input_audio.append`` with
one ``input_audio.received {client_seq, bytes}``.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import importlib
import random
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import anyio

from supervisor.gateway._flag_spec import flag
from supervisor.gateway._protocol import ClientEvent

__all__ = [
    "ClientEvent",
    "DemoEngine",
    "Engine",
    "EngineConfig",
    "EngineSession",
    "RealtimeEngine",
    "SessionEnded",
    "SessionPresence",
    "client_event_types",
    "load_callable",
    "load_engine_factory",
]

_WORDS = ("the", "quick", "resumable", "stream", "never", "drops", "an", "event", "again")


class SessionEnded(Exception):  # noqa: N818 - a signal to the engine's task, not a failure
    """The session is over (closed, expired, failed, overflowed): stop working on it."""


class SessionPresence:
    """What the gateway tells an `EngineSession` as it happens: whether a client
    is attached, what it acked and sent, and the scopes it may cancel."""

    def __init__(self) -> None:
        self.attached = False
        self.acked_server_event_seq = 0
        self.last_client_seq = 0
        self.cancellable: dict[str, set[anyio.CancelScope]] = {}
        self._changed: anyio.Event | None = None

    def set_attached(self, attached: bool) -> None:
        if attached != self.attached:
            self.attached = attached
            if self._changed is not None:
                self._changed.set()
                self._changed = None

    async def wait_for(self, attached: bool) -> None:
        while self.attached != attached:
            if self._changed is None:
                self._changed = anyio.Event()
            await self._changed.wait()

    def cancel(self, key: str) -> int:
        """Cancel every scope held under ``key``; how many there were."""
        scopes = self.cancellable.get(key, set())
        for scope in scopes:
            scope.cancel()
        return len(scopes)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineSession:
    """What an engine sees of one session: its id, the client's identity, ``send``,
    whether a client is attached, and a way to close it."""

    session_id: str
    #: What the gateway's ``authenticate`` hook returned for the client (``None``: none).
    identity: object
    _send: Callable[[Mapping[str, object]], Awaitable[None]] = field(repr=False)
    _send_many: Callable[[Sequence[Mapping[str, object]]], Awaitable[None]] = field(repr=False)
    _close: Callable[[str], None] | None = field(default=None, repr=False)
    _presence: SessionPresence = field(default_factory=SessionPresence, repr=False)

    @property
    def attached(self) -> bool:
        """Whether a client's connection is attached to the session now."""
        return self._presence.attached

    async def wait_attached(self) -> None:
        """Return once a client is attached (at once if one is)."""
        await self._presence.wait_for(True)

    async def wait_detached(self) -> None:
        """Return once no client is attached (at once if none is)."""
        await self._presence.wait_for(False)

    @property
    def acked_server_event_seq(self) -> int:
        """The highest ``server_event_seq`` the client acked (0: none yet)."""
        return self._presence.acked_server_event_seq

    @property
    def last_client_seq(self) -> int:
        """The last ``client_seq`` the gateway accepted from the client."""
        return self._presence.last_client_seq

    @contextlib.contextmanager
    def cancellable(self, response_id: str) -> Iterator[anyio.CancelScope]:
        """A cancel scope that the client's ``response.cancel {response_id}`` cancels
        (barge-in): the work inside stops, and the ``with`` block ends quietly."""
        scopes = self._presence.cancellable.setdefault(response_id, set())
        with anyio.CancelScope() as scope:
            scopes.add(scope)
            try:
                yield scope
            finally:
                scopes.discard(scope)
                if not scopes:
                    self._presence.cancellable.pop(response_id, None)

    async def close(self, reason: str) -> None:
        """End the session for good: the client gets ``session.closed {reason}`` and
        a close 1000 ``session_closed``; the engine then hears ``stop``."""
        if self._close is not None:
            self._close(reason)

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


class RealtimeEngine(Engine, Protocol):
    """An `Engine` that takes client events of the types it declares."""

    client_event_types: frozenset[str]

    async def on_client_event(self, session: EngineSession, event: ClientEvent) -> None: ...


def client_event_types(engine: Engine) -> frozenset[str]:
    """What ``engine`` declares it takes (none unless it has ``on_client_event``)."""
    if not callable(getattr(engine, "on_client_event", None)):
        return frozenset()
    return frozenset(getattr(engine, "client_event_types", ()))


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

    event_rate_hz: float = field(
        default=20.0,
        metadata=flag(
            "events per second each session's engine streams, attached or not (default {default})",
            group="demo engine",
            metavar="HZ",
            parse="non-negative",
        ),
    )
    delta_chars: int = field(
        default=24,
        metadata=flag(
            "characters of text per streamed delta (default {default})",
            group="demo engine",
            metavar="N",
        ),
    )
    deltas_per_answer: int = 3

    def __post_init__(self) -> None:
        if not self.event_rate_hz >= 0:
            raise ValueError("event_rate_hz must be >= 0 (0: answer inputs only)")
        if self.delta_chars < 1 or self.deltas_per_answer < 1:
            raise ValueError("delta_chars and deltas_per_answer must be >= 1")


class DemoEngine:
    """A `RealtimeEngine`: what a realtime engine does to a session, minus the model."""

    client_event_types = frozenset({"input_audio.append", "response.cancel"})

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

    async def on_client_event(self, session: EngineSession, event: ClientEvent) -> None:
        """Each audio chunk is answered with one ``input_audio.received``; a
        ``response.cancel`` needs nothing more (the gateway cancelled the answer)."""
        if event.type != "input_audio.append":
            return
        data = event.data
        if data is None:
            audio = event.fields.get("audio")
            try:
                data = base64.b64decode(audio if isinstance(audio, str) else "", validate=True)
            except (binascii.Error, ValueError):
                data = b""
        await self._send(
            session,
            {"type": "input_audio.received", "client_seq": event.client_seq, "bytes": len(data)},
        )

    def stop(self, session_id: str) -> None:
        self._responses.pop(session_id, None)
