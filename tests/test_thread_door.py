"""The blocking door: the two bugs of its old second outbox, and its shutdown."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from functools import partial

import pytest

from actors._commands import LifecycleEvent
from actors._errors import SendTimeoutError, SessionError, UnknownSessionError
from supervisor._faults import FaultPlan
from supervisor.doors._threads import ThreadSessionRegistry
from supervisor.testing import Wire

WAIT = 10.0


def _eventually(condition: Callable[[], bool]) -> bool:
    """Whether ``condition`` holds within ``WAIT`` (polled: another thread makes it so)."""
    ends = time.monotonic() + WAIT
    while not condition():
        if time.monotonic() > ends:
            return False
        time.sleep(0.001)
    return True


def _registry(**options: object) -> ThreadSessionRegistry:
    values: dict[str, object] = {
        "replay_ttl_s": 60,
        "replay_max_bytes_per_session": 1 << 20,
        "sweep_interval_s": None,
        "timeout": WAIT,
    }
    values.update(options)
    return ThreadSessionRegistry(**values)  # type: ignore[arg-type]


def test_a_nowait_event_sent_just_before_exit_reaches_the_wire() -> None:
    # The README's example: the old thread outbox dropped this frame at exit
    # in about one run of four, silently.
    for _ in range(50):
        wire: list[dict[str, object]] = []
        with _registry() as registry:
            registry.create("s1", send=wire.append, close=lambda reason: None)
            registry.send_event_nowait("s1", {"type": "delta", "text": "hi"})
        assert wire == [{"type": "delta", "text": "hi", "server_event_seq": 1}]


def test_a_raising_on_accepted_of_an_unjournaled_event_does_not_block_the_caller() -> None:
    # The old thread outbox never answered this caller: it waited out its
    # whole timeout. The trio door answers at once; so must this one.
    def boom() -> None:
        raise RuntimeError("on_accepted must not raise")

    wire: list[dict[str, object]] = []
    with _registry() as registry:
        registry.create("s1", send=wire.append, close=lambda reason: None)
        assert registry.send_event("s1", {"type": "ping"}, journal=False, on_accepted=boom) is None
        assert registry.send_event("s1", {"type": "after"}) is not None
    assert wire == [{"type": "ping"}, {"type": "after", "server_event_seq": 1}]


def test_send_event_nowait_to_an_unknown_session_is_an_unknown_session_error() -> None:
    with _registry() as registry, pytest.raises(UnknownSessionError) as caught:
        registry.send_event_nowait("nope", {"type": "x"})
    assert isinstance(caught.value, KeyError)


def test_a_hung_blocking_send_times_out_and_the_transport_is_closed() -> None:
    release = threading.Event()
    closed: list[str] = []
    events: list[LifecycleEvent] = []

    def hung_send(frame: dict[str, object]) -> None:
        release.wait(WAIT)

    try:
        with _registry(send_timeout_s=0.05, observer=events.append) as registry:
            registry.create("s1", send=hung_send, close=closed.append)
            with pytest.raises(SendTimeoutError):
                registry.send_event("s1", {"type": "x"})
            # The owner still detaches, as in the seed.
            assert registry.detach("s1", attachment_generation=1) is True
    finally:
        release.set()
    assert closed == ["send_timeout"]
    assert [e.kind for e in events if e.kind == "send_timeout"] == ["send_timeout"]


def test_transport_faults_reach_blocking_sends() -> None:
    plan = FaultPlan()
    plan.fail_send("s1", nth=2)
    wire: list[dict[str, object]] = []
    with _registry(faults=plan) as registry:
        registry.create("s1", send=wire.append, close=lambda reason: None)
        registry.send_event("s1", {"n": 1})
        with pytest.raises(Exception, match=r"."):
            registry.send_event("s1", {"n": 2})
        registry.send_event("s1", {"n": 3})
    assert [frame["n"] for frame in wire] == [1, 3]


def test_the_send_timeout_bounds_each_frame_not_a_whole_delivery() -> None:
    # Three frames of 0.8 s each: 2.4 s for the delivery, under 2 s for each
    # send. The thread door sends a delivery in one worker hop; its watchdog
    # must still measure each frame, as the async doors do.
    wire: list[dict[str, object]] = []

    def slow_send(frame: dict[str, object]) -> None:
        threading.Event().wait(0.8)
        wire.append(frame)

    with _registry(send_timeout_s=2.0) as registry:
        registry.create("s1", send=slow_send, close=lambda reason: None)
        entries = registry.send_events("s1", [{"n": 1}, {"n": 2}, {"n": 3}])
    assert [entry.sequence for entry in entries if entry is not None] == [1, 2, 3]
    assert [frame["n"] for frame in wire] == [1, 2, 3]


def test_a_refused_nowait_event_reaches_the_observer() -> None:
    events: list[LifecycleEvent] = []
    wire: list[dict[str, object]] = []
    with _registry(observer=events.append) as registry:
        registry.create("s1", send=wire.append, close=lambda reason: None)
        registry.send_event_nowait("s1", {"n": float("nan")})  # not JSON: refused later
        registry.send_event("s1", {"n": 2})
    assert [(e.kind, e.reason) for e in events if e.kind == "event_refused"] == [
        ("event_refused", "InvalidPayloadError")
    ]
    assert wire == [{"n": 2, "server_event_seq": 1}]


def test_send_event_nowait_past_max_pending_is_queue_full() -> None:
    wire = Wire()
    gate = wire.hold(1)
    try:
        with _registry(max_pending_per_session=1) as registry:
            registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
            registry.send_event_nowait("s1", {"n": 1})
            assert gate.entered.wait_blocking(WAIT)  # in flight until its send returns
            with pytest.raises(queue.Full):
                registry.send_event_nowait("s1", {"n": 2})
            gate.release()
    finally:
        gate.release()
    assert wire.sequences() == [1]


def test_a_threads_nowait_events_and_blocking_calls_keep_its_order() -> None:
    # Another thread's traffic makes actor replies and the nowait events
    # race for the loop; a blocking call must still reach the session after
    # the events this thread queued before it (the old hop overtook them).
    wire: list[dict[str, object]] = []
    noise: list[dict[str, object]] = []
    with _registry() as registry:
        registry.create("noise", send=noise.append, close=lambda reason: None)
        registry.create("s1", send=wire.append, close=lambda reason: None)
        stop = threading.Event()

        def hammer() -> None:
            while not stop.is_set():
                with contextlib.suppress(queue.Full):
                    registry.send_event_nowait("noise", {"x": 1}, journal=False)
                stop.wait(0.0005)

        threads = [threading.Thread(target=hammer) for _ in range(2)]
        for thread in threads:
            thread.start()
        try:
            for n in range(0, 600, 2):
                registry.send_event_nowait("s1", {"n": n})
                registry.send_event("s1", {"n": n + 1})
        finally:
            stop.set()
            for thread in threads:
                thread.join()
    assert [frame["n"] for frame in wire] == list(range(600))


def test_a_blocking_call_past_the_timeout_raises_and_is_cancelled_as_on_the_async_door() -> None:
    wire = Wire()
    gate = wire.hold(1)
    try:
        with _registry(timeout=1.0, send_timeout_s=None) as registry:
            created = registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
            with pytest.raises(TimeoutError):
                registry.send_event("s1", {"n": 1})
            gate.release()
            # Cancelled while its frame was on the wire: it stays journaled.
            assert registry.detach("s1", attachment_generation=1)
            result = registry.resume(
                "s1",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=wire.send_blocking,
                close=wire.close_blocking,
            )
            assert [entry.sequence for entry in result.replay_entries] == [1]
    finally:
        gate.release()


# -- a blocking call without a task: waiting for room, timing out, shutting down ------------


def test_a_blocking_send_waiting_for_room_past_the_timeout_is_cancelled_unsent() -> None:
    wire = Wire()
    gate = wire.hold(1)
    try:
        with _registry(max_pending_per_session=1, timeout=1.0, send_timeout_s=None) as registry:
            registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
            registry.send_event_nowait("s1", {"n": 1})
            assert gate.entered.wait_blocking(WAIT)
            with pytest.raises(TimeoutError):
                registry.send_event("s1", {"n": 2})
            gate.release()
            # Cancelled before it reached the session: never journaled.
            entry = registry.send_event("s1", {"n": 3})
            assert entry is not None and entry.sequence == 2
    finally:
        gate.release()
    assert [frame["n"] for frame in wire.frames] == [1, 3]


def test_a_blocking_send_waiting_for_room_is_sent_once_a_call_settles() -> None:
    wire = Wire()
    gate = wire.hold(1)
    answers: list[object] = []
    try:
        with _registry(max_pending_per_session=1) as registry:
            registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
            registry.send_event_nowait("s1", {"n": 1})
            assert gate.entered.wait_blocking(WAIT)
            caller = threading.Thread(
                target=lambda: answers.append(registry.send_event("s1", {"n": 2}))
            )
            caller.start()
            gate.release()
            caller.join(WAIT)
    finally:
        gate.release()
    assert [getattr(entry, "sequence", None) for entry in answers] == [2]
    assert wire.sequences() == [1, 2]


def test_blocking_callers_waiting_at_shutdown_are_answered() -> None:
    wire = Wire()
    gate = wire.hold(1)
    answers: dict[int, object] = {}

    def call(registry: ThreadSessionRegistry, n: int) -> None:
        try:
            answers[n] = registry.send_event("s1", {"n": n})
        except BaseException as exc:
            answers[n] = exc

    try:
        with _registry(
            drain_timeout_s=0.05, send_timeout_s=None, max_pending_per_session=1
        ) as registry:
            registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
            on_the_wire = threading.Thread(target=call, args=(registry, 1))
            on_the_wire.start()
            assert gate.entered.wait_blocking(WAIT)
            # This one waits for room: the first call is in flight.
            waiting = threading.Thread(target=call, args=(registry, 2))
            waiting.start()
            door = registry._hosted()
            assert _eventually(lambda: "s1" in door._calls.room)
        on_the_wire.join(WAIT)
        waiting.join(WAIT)
    finally:
        gate.release()
    # The frame on the wire was accepted (journaled, it would replay); the
    # waiting call is answered with an error and never reached the wire.
    # (Today UnknownSessionError on every door: the session stopped while
    # the call waited for room.)
    assert getattr(answers[1], "sequence", None) == 1
    assert isinstance(answers[2], SessionError)
    assert all(frame["n"] != 2 for frame in wire.frames)


def test_a_blocking_transports_error_reaches_the_blocking_caller() -> None:
    def send(frame: dict[str, object]) -> None:
        raise ConnectionResetError("the client went away")

    with _registry() as registry:
        registry.create("s1", send=send, close=lambda reason: None)
        with pytest.raises(ConnectionResetError):
            registry.send_event("s1", {"n": 1})
        # As in the seed: the event stays journaled, the attachment attached.
        assert registry.has_attachment("s1")
        assert registry.acknowledge("s1", 1) == 1


def test_blocking_sends_in_a_row_with_one_call_of_room_go_out_in_order() -> None:
    # The caller is answered from the worker thread before the loop frees
    # the call's slot: its next call may find no room yet, and must wait.
    wire = Wire()
    with _registry(max_pending_per_session=1) as registry:
        registry.create("s1", send=wire.send_blocking, close=wire.close_blocking)
        entries = [registry.send_event("s1", {"n": n}) for n in range(1, 201)]
    assert [getattr(entry, "sequence", None) for entry in entries] == list(range(1, 201))
    assert wire.sequences() == list(range(1, 201))


def test_an_unjournaled_events_on_accepted_ran_when_its_blocking_send_returns() -> None:
    accepted: list[int] = []
    with _registry() as registry:
        registry.create("s1", send=lambda frame: None, close=lambda reason: None)
        for n in range(50):
            registry.send_event(
                "s1", {"n": n}, journal=False, on_accepted=partial(accepted.append, n)
            )
            assert accepted[-1:] == [n]
