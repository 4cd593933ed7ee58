"""No resume token in any log record, repr, str, error or event during a chaos run.

Chaos clients cut and resume against a gateway whose sessions crash now and
then (injected at their sweep), while an intruder presents wrong, stale and
unknown tokens. Every token the run issues is collected: from the
``session.created`` and ``session.resumed`` frames the clients receive and
from the results of the registry's ``create`` and ``resume``. Captured
meanwhile: every log record of every logger at DEBUG (message, arguments,
exception and traceback text); the repr and str of every result and every
error of every registry call (with their ``__cause__``/``__context__``
chains), of every lifecycle event, of the registry, its stats, the gateway
and its counters; and every few hundred milliseconds the repr and str of
every live object whose class comes from ``actors``, ``supervisor`` or
``pykka`` (sessions' states, journals and entries, replies, outboxes,
actors, tokens). No token, nor its first or last 16 characters, may appear
in any of it.
"""

from __future__ import annotations

import functools
import gc
import inspect
import logging
import random
import traceback
from collections.abc import Callable
from typing import Any

import pytest
import trio

from supervisor._faults import FaultPlan
from supervisor.cli._chaos import ChaosConfig, run_chaos
from supervisor.cli._wire_client import WireClient, WireClosedError
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig
from tests.soak_support import Frame, fresh_address, patched, record_figures, serving

MODULES = ("actors", "supervisor", "pykka")
SPIED = (
    "create",
    "send_event",
    "send_events",
    "acknowledge",
    "detach",
    "release_attachment",
    "begin_resume",
    "end_resume",
    "authenticate_resume",
    "resume",
    "abandon_resume",
    "close",
    "has_attachment",
    "is_current_attachment",
    "sweep",
)


class Capture:
    """Tokens issued, and every text that must not show one."""

    def __init__(self) -> None:
        self.tokens: set[str] = set()
        self.by_session: dict[str, list[str]] = {}
        self.texts: list[str] = []
        self.errors = 0
        self.objects_seen = 0

    def token(self, frame: Frame) -> None:
        token, session_id = frame.get("resume_token"), frame.get("session_id")
        if frame.get("type") in ("session.created", "session.resumed") and isinstance(token, str):
            self.tokens.add(token)
            self.by_session.setdefault(str(session_id), []).append(token)

    def text(self, *objects: object) -> None:
        for obj in objects:
            self.texts += (repr(obj), str(obj))
            token = getattr(obj, "resume_token", None)
            if token is not None:
                self.tokens.add(token.plaintext)

    def error(self, error: BaseException) -> None:
        self.errors += 1
        self.texts.append("".join(traceback.format_exception(error)))
        seen: set[int] = set()
        current: BaseException | None = error
        while current is not None and id(current) not in seen:
            seen.add(id(current))
            self.text(current)
            current = current.__cause__ or current.__context__

    def scan(self, gateway: Gateway) -> None:
        registry = gateway.registry
        self.text(gateway, registry, registry.stats(), gateway.counters, gateway.engine)
        for obj in gc.get_objects():
            module = getattr(type(obj), "__module__", "") or ""
            if module.split(".")[0] in MODULES and not inspect.isclass(obj):
                self.objects_seen += 1
                try:
                    self.text(obj)
                except Exception as exc:  # a repr racing another thread
                    self.texts.append(f"{type(obj).__name__}: repr raised {exc!r}")

    def spy(self, gateway: Gateway) -> None:
        registry = gateway.registry
        for name in SPIED:
            setattr(registry, name, self._wrap_async(getattr(registry, name)))
        for name in ("stats", "session_ids", "send_event_nowait"):
            setattr(registry, name, self._wrap_sync(getattr(registry, name)))
        observe = gateway.observe

        def observed(event: Any) -> None:
            self.text(event)
            observe(event)

        gateway.observe = observed  # type: ignore[method-assign]

    def _wrap_async(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        async def spied(*args: Any, **kwargs: Any) -> Any:
            try:
                result = await method(*args, **kwargs)
            except BaseException as exc:
                self.error(exc)
                raise
            self.text(result)
            return result

        return spied

    def _wrap_sync(self, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def spied(*args: Any, **kwargs: Any) -> Any:
            try:
                result = method(*args, **kwargs)
            except BaseException as exc:
                self.error(exc)
                raise
            self.text(result)
            return result

        return spied


def _tapping(capture: Capture) -> Callable[[Any], Any]:
    def wrap(receive: Callable[[WireClient], Any]) -> Callable[[WireClient], Any]:
        async def receive_json(self: WireClient) -> Frame:
            frame: Frame = await receive(self)
            capture.token(frame)
            return frame

        return receive_json

    return wrap


async def _intrude(gateway: Gateway, capture: Capture, plan: FaultPlan) -> None:
    """Wrong, stale and unknown tokens against live sessions; crashes at their sweeps."""
    rng = random.Random(7)  # noqa: S311 - test data
    crashed: set[str] = set()
    while True:
        await trio.sleep(0.1)
        live = gateway.registry.session_ids()
        stale = [t for tokens in capture.by_session.values() for t in tokens[:-1]]
        fresh = [s for s in live if s not in crashed]
        if fresh and rng.random() < 0.3:
            crashed.add(target := rng.choice(fresh))
            plan.crash(rng.choice(["tick.enter", "tick.pruned"]), session_id=target)
        session_id = rng.choice(live) if live else "sess_gone"
        token = rng.choice(stale) if stale and rng.random() < 0.5 else "x" * 43
        for sid in (session_id, "sess_unknown"):
            client = await WireClient.connect(gateway.url, local_address=fresh_address())
            await client.send_json(
                {
                    "type": "session.resume",
                    "session_id": sid,
                    "resume_token": token,
                    "last_received_server_event_seq": 10**6,
                }
            )
            try:
                refused = await client.receive_json()
                assert refused["type"] == "error", refused
            except WireClosedError:
                pass
            finally:
                await client.cut()


async def _scan_every(gateway: Gateway, capture: Capture, interval_s: float) -> None:
    while True:
        await trio.sleep(interval_s)
        capture.scan(gateway)


def _log_texts(records: list[logging.LogRecord]) -> list[str]:
    formatter = logging.Formatter("%(name)s %(levelname)s %(message)s")
    texts: list[str] = []
    for record in records:
        texts += (formatter.format(record), repr(record.args), repr(record.msg))
    return texts


async def test_no_resume_token_shows_in_logs_reprs_errors_or_events(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.DEBUG, logger="duplex_supervisor")
    capture, plan = Capture(), FaultPlan()
    config = GatewayConfig(port=0, resume_failures_allowed=10_000)
    chaos = ChaosConfig(clients=6, duration_s=4.0, drop_rate=2.0, input_rate_hz=2.0, seed=5)
    with trio.fail_after(60), patched(WireClient, "receive_json", _tapping(capture)):
        async with serving(config, engine=EngineConfig(event_rate_hz=50), faults=plan) as gw:
            capture.spy(gw)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_scan_every, gw, capture, 0.3)
                nursery.start_soon(_intrude, gw, capture, plan)
                report = await run_chaos(gw.url, chaos)
                nursery.cancel_scope.cancel()
            capture.scan(gw)
            stats, resumed = gw.registry.stats(), gw.counters.resumes
    assert report.ok, report.totals
    totals = report.totals
    # The run did what it is meant to: many tokens, crashes, refusals, logs.
    assert totals.resumes > 10
    assert len(capture.tokens) >= totals.sessions + resumed
    assert stats.crashes >= 1 and stats.invalid_tokens >= 5
    assert capture.errors >= 10 and capture.objects_seen > 1000
    texts = capture.texts + _log_texts(caplog.records)
    record_figures(
        "test_no_resume_token_shows_in_logs_reprs_errors_or_events",
        {
            "tokens": len(capture.tokens),
            "texts": len(texts),
            "log_records": len(caplog.records),
            "objects_scanned": capture.objects_seen,
            "errors_seen": capture.errors,
            "crashes": stats.crashes,
            "invalid_tokens": stats.invalid_tokens,
        },
    )
    assert any("crashed" in t for t in _log_texts(caplog.records))
    blob = "\n".join(texts)
    for token in capture.tokens:
        for part in (token, token[:16], token[-16:]):
            at = blob.find(part)
            assert at < 0, f"a token shows in: {blob[max(0, at - 300) : at + 100]!r}"
