"""The loop runtime: actors run in turns on their registry's loop, serially.

A session's transition never runs on two threads, nor twice at once, however
its callers reach it (loop tasks, plain threads, the thread door); a message
from the loop to an idle actor is handled inline; one sent from inside a turn
is scheduled, never nested; a blocking ``get`` on the loop of an answer not
there yet raises instead of hanging; a busy actor yields the loop.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import uuid
from typing import Any

import pykka
import trio

from actors._commands import SendEvent
from actors._loop_actor import (
    THROUGHPUT,
    LoopActor,
    StoppedFlag,
    enter_loop_thread,
    leave_loop_thread,
)
from actors._mailbox import ClosableInbox, SessionMailbox
from supervisor import ThreadSessionRegistry, open_asyncio_registry, open_session_registry
from supervisor._faults import FaultPlan
from supervisor.doors._loop_port import CoalescingPort
from supervisor.testing import Wire
from tests.helpers import ThreadReply

LIMIT = 30.0
TASKS = 8
THREADS = 4
EACH = 40


class _Watch(FaultPlan):
    """Records, per transition, the thread it ran on and whether another was running."""

    def __init__(self) -> None:
        super().__init__()
        self._watch_lock = threading.Lock()
        self.inside = False
        self.threads: set[int] = set()
        self.overlaps = 0
        self.transitions = 0

    def hit(self, name: str, session_id: str) -> None:
        if name == "send_event.enter":
            with self._watch_lock:
                self.overlaps += self.inside
                self.inside = True
                self.threads.add(threading.get_ident())
                self.transitions += 1
            time.sleep(0)  # let any other thread in, were it allowed
        elif name == "send_event.effects":
            with self._watch_lock:
                self.inside = False
        super().hit(name, session_id)


def _options(watch: _Watch) -> dict[str, Any]:
    return {"replay_ttl_s": 60, "replay_max_bytes_per_session": 1 << 24, "faults": watch}


def _assert_serial_on_one_thread(watch: _Watch, errors: list[BaseException]) -> None:
    assert errors == []
    assert watch.overlaps == 0
    assert len(watch.threads) == 1


def _hammer_from_threads(system: Any, errors: list[BaseException]) -> list[threading.Thread]:
    def run() -> None:
        try:
            for n in range(EACH):
                reply = ThreadReply()
                system.call("s", SendEvent(payload={"n": n}), reply)
                reply.wait(LIMIT)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    return threads


async def test_trio_a_sessions_transitions_run_one_at_a_time_on_the_loop_thread() -> None:
    watch, errors = _Watch(), list[BaseException]()
    with trio.fail_after(LIMIT):
        async with open_session_registry(**_options(watch)) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            threads = _hammer_from_threads(reg.system, errors)

            async def task() -> None:
                for n in range(EACH):
                    await reg.send_event("s", {"n": n})
                    reg.send_event_nowait("s", {"n": n})

            async with trio.open_nursery() as nursery:
                for _ in range(TASKS):
                    nursery.start_soon(task)
            for thread in threads:
                await trio.to_thread.run_sync(thread.join)
            await reg.has_attachment("s")
            stats = reg.stats()
    _assert_serial_on_one_thread(watch, errors)
    total = THREADS * EACH + 2 * TASKS * EACH
    assert stats.events_journaled == total
    assert watch.threads == {threading.get_ident()}  # the loop's own thread only
    assert watch.transitions >= total - TASKS * EACH  # nowait bursts may batch


def test_asyncio_a_sessions_transitions_run_one_at_a_time_on_the_loop_thread() -> None:
    watch, errors = _Watch(), list[BaseException]()

    async def scenario() -> None:
        async with open_asyncio_registry(**_options(watch)) as reg:
            wire = Wire()
            await reg.create("s", send=wire.send, close=wire.close)
            threads = _hammer_from_threads(reg.system, errors)

            async def task() -> None:
                for n in range(EACH):
                    await reg.send_event("s", {"n": n})

            await asyncio.gather(*(task() for _ in range(TASKS)))
            loop = asyncio.get_running_loop()
            for thread in threads:
                await loop.run_in_executor(None, thread.join)
            assert reg.stats().events_journaled == THREADS * EACH + TASKS * EACH

    asyncio.run(asyncio.wait_for(scenario(), LIMIT))
    _assert_serial_on_one_thread(watch, errors)
    assert watch.transitions == THREADS * EACH + TASKS * EACH


def test_thread_door_engine_threads_all_cross_onto_the_one_loop_thread() -> None:
    watch, errors = _Watch(), list[BaseException]()
    with ThreadSessionRegistry(timeout=LIMIT, **_options(watch)) as reg:
        wire = Wire()
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)

        def engine() -> None:
            try:
                for n in range(EACH):
                    reg.send_event("s", {"n": n})
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=engine) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        threads += _hammer_from_threads(reg.system, errors)
        for thread in threads:
            thread.join(LIMIT)
        assert reg.stats().events_journaled == 2 * THREADS * EACH
    _assert_serial_on_one_thread(watch, errors)
    assert threading.get_ident() not in watch.threads


# -- the actor type itself --------------------------------------------------------------


class _Recorder(LoopActor):
    """Records what it handled, and whether a turn ran inside another."""

    depth = 0

    def __init__(self, port: CoalescingPort, log: list[Any]) -> None:
        self.actor_loop = port
        super().__init__()
        self.log = log
        self.nested = 0
        self.peer: pykka.ActorRef[_Recorder] | None = None

    def _create_actor_inbox(self) -> Any:  # type: ignore[override]
        return ClosableInbox((), "closed")

    def on_receive(self, message: Any) -> Any:
        _Recorder.depth += 1
        try:
            self.nested += _Recorder.depth > 1
            self.log.append((self.actor_urn, message))
            if message == "forward" and self.peer is not None:
                self.peer.tell("forwarded")
                self.log.append((self.actor_urn, "told"))
            if message == "ask the peer" and self.peer is not None:
                try:
                    return self.peer.ask("asked")
                except RuntimeError as exc:
                    return "refused: would wait forever" if "wait forever" in str(exc) else exc
            return message
        finally:
            _Recorder.depth -= 1


async def _port() -> CoalescingPort:
    return CoalescingPort(trio.lowlevel.current_trio_token().run_sync_soon)


async def _pair(log: list[Any]) -> tuple[pykka.ActorRef[_Recorder], pykka.ActorRef[_Recorder]]:
    """Two recorders on this loop, the first one's peer the second."""
    port = await _port()
    first, second = _Recorder.start(port, log), _Recorder.start(port, log)
    first.proxy().peer = second
    return first, second


async def _handled(log: list[Any], count: int) -> list[Any]:
    """The messages handled, once there are ``count`` entries."""
    with trio.fail_after(LIMIT):
        while len(log) < count:
            await trio.sleep(0)
    return [m for _, m in log]


async def test_an_ask_from_the_loop_to_an_idle_actor_is_answered_inline() -> None:
    port, log = await _port(), list[Any]()
    ref = _Recorder.start(port, log)
    try:
        future = ref.ask("hello", block=False)
        # No checkpoint since: it ran in this task's own stack.
        assert log == [(ref.actor_urn, "hello")]
        assert future.get() == "hello"
    finally:
        ref.stop(block=False)


async def test_a_message_sent_from_inside_a_turn_is_scheduled_not_nested() -> None:
    log = list[Any]()
    first, second = await _pair(log)
    await trio.testing.wait_all_tasks_blocked()
    first.tell("forward")
    # The peer's message waits for the loop: the forward turn ended first.
    assert [m for _, m in log] == ["forward", "told"]
    assert await _handled(log, 3) == ["forward", "told", "forwarded"]
    assert first.proxy().nested.get() == 0
    assert second.proxy().nested.get() == 0
    first.stop(block=False)
    second.stop(block=False)


async def test_a_blocking_get_on_the_loop_of_an_answer_not_there_raises() -> None:
    log = list[Any]()
    asker, peer = await _pair(log)
    # Inside the asker's turn, the peer's answer needs a later turn of the
    # same loop: a blocking get() there raises instead of hanging.
    assert asker.ask("ask the peer") == "refused: would wait forever"
    assert await _handled(log, 2) == ["ask the peer", "asked"]
    # From a plain thread a blocking ask waits for the loop, as with pykka's threads.
    assert await trio.to_thread.run_sync(lambda: peer.ask("from a thread")) == "from a thread"
    enter_loop_thread()
    try:
        future = await trio.to_thread.run_sync(lambda: peer.ask("x", block=False))
        assert future.get() == "x"  # answered by the time this task runs again
    finally:
        leave_loop_thread(threading.get_ident())
    asker.stop(block=False)
    peer.stop(block=False)


async def test_a_busy_actor_yields_the_loop_after_its_throughput() -> None:
    port, log = await _port(), list[Any]()
    busy = _Recorder.start(port, log)
    other = _Recorder.start(port, log)

    def flood() -> None:
        # From another thread: both are scheduled, neither runs inline.
        for n in range(3 * THROUGHPUT):
            busy.tell(n)
        other.tell("other")

    await trio.to_thread.run_sync(flood)
    handled = await _handled(log, 3 * THROUGHPUT + 1)
    # The other actor got its turn before the busy one's third.
    assert handled.index("other") <= 2 * THROUGHPUT
    assert [m for m in handled if m != "other"] == list(range(3 * THROUGHPUT))
    busy.stop(block=False)
    other.stop(block=False)


def test_a_loop_actor_sets_every_field_pykkas_actor_init_sets() -> None:
    # LoopActor.__init__ restates pykka's (to make a lighter stopped flag):
    # a pykka release that adds a field must fail here, not in production.
    plain = pykka.ThreadingActor()  # pykka.Actor.__init__, a real inbox
    port = CoalescingPort(lambda fn: fn())
    ours = _Recorder(port, [])
    assert set(vars(plain)) <= set(vars(ours))
    assert ours.actor_ref.actor_stopped is ours.actor_stopped
    assert isinstance(ours.actor_stopped, threading.Event)


def test_a_loop_actors_urn_is_a_distinct_uuid4_urn_as_pykkas() -> None:
    port = CoalescingPort(lambda fn: fn())
    urns = {_Recorder(port, []).actor_urn for _ in range(1000)}
    assert len(urns) == 1000
    for urn in urns:
        parsed = uuid.UUID(urn.removeprefix("urn:uuid:"))
        assert parsed.urn == urn
        assert (parsed.version, parsed.variant) == (4, uuid.RFC_4122)


def test_actor_urns_do_not_repeat_when_someone_reseeds_the_random_module() -> None:
    # An engine, a test or Hypothesis may seed `random`; two live actors with
    # one URN would overwrite each other in the supervisor's books.
    port = CoalescingPort(lambda fn: fn())
    state = random.getstate()
    try:
        random.seed(7)
        first = _Recorder(port, []).actor_urn
        random.seed(7)
        assert _Recorder(port, []).actor_urn != first
    finally:
        random.setstate(state)


def test_a_stopped_flag_wakes_a_thread_waiting_on_it() -> None:
    flag = StoppedFlag()
    assert not flag.is_set()
    assert flag.wait(0.001) is False
    woke: list[bool] = []
    waiter = threading.Thread(target=lambda: woke.append(flag.wait(LIMIT)))
    waiter.start()
    flag.set()
    waiter.join(LIMIT)
    assert woke == [True]
    assert flag.is_set() and flag.wait(0)
    flag.clear()
    assert not flag.is_set()


async def test_a_stopped_actors_ref_says_it_is_dead() -> None:
    port, log = await _port(), list[Any]()
    ref = _Recorder.start(port, log)
    assert ref.is_alive()
    ref.stop(block=False)
    with trio.fail_after(LIMIT):
        while ref.is_alive():
            await trio.sleep(0)
    ref.actor_stopped.wait(LIMIT)  # set: returns at once, no condition made to wait


class _Owner:
    """A `SessionMailboxOwner` that never parks anything."""

    def __init__(self) -> None:
        self.mailbox_lock = threading.Lock()

    def wake(self, mailbox: SessionMailbox) -> None:
        raise AssertionError("nothing here parks")


class _MailboxRecorder(_Recorder):
    """A recorder run from a `SessionMailbox`; on ``"again"`` it tells itself once more."""

    def __init__(self, port: CoalescingPort, log: list[Any], mailbox: SessionMailbox) -> None:
        self.mailbox = mailbox
        super().__init__(port, log)

    def _create_actor_inbox(self) -> Any:  # type: ignore[override]
        return self.mailbox

    def on_receive(self, message: Any) -> Any:
        if message == "boom":
            raise ValueError("a handler's bug")
        if message == "again":
            self.mailbox.tell("told from inside the turn")
        return super().on_receive(message)


def _held_port() -> tuple[CoalescingPort, list[Any]]:
    """A port on this thread whose drains wait in a list until the test runs them."""
    drains: list[Any] = []
    return CoalescingPort(drains.append), drains


def _session_recorder() -> tuple[
    CoalescingPort, list[Any], list[Any], SessionMailbox, pykka.ActorRef[_MailboxRecorder]
]:
    """A recorder run from a session's mailbox on a held port: the port, its
    held drains, the log, the mailbox and the recorder's ref."""
    port, drains = _held_port()
    log: list[Any] = []
    mailbox = SessionMailbox("s", _Owner())
    return port, drains, log, mailbox, _MailboxRecorder.start(port, log, mailbox)


def _run_drains(drains: list[Any]) -> None:
    while drains:
        drains.pop(0)()


def test_a_message_told_on_the_loop_to_an_idle_session_is_handled_in_the_callers_stack() -> None:
    _, drains, log, mailbox, ref = _session_recorder()
    mailbox.tell("now")
    assert [m for _, m in log] == ["now"]  # no drain ran: handled inline
    assert drains == []
    ref.stop(block=False)
    _run_drains(drains)


def test_a_message_told_on_the_loop_behind_queued_ones_waits_its_turn() -> None:
    _, drains, log, mailbox, ref = _session_recorder()

    # From another thread: queued, and a turn asked of the (held) loop.
    def send() -> None:
        for n in (1, 2):
            mailbox.tell(n)

    sender = threading.Thread(target=send)
    sender.start()
    sender.join()
    mailbox.tell("after them")
    assert log == []  # not run ahead of the queued ones
    _run_drains(drains)
    assert [m for _, m in log] == [1, 2, "after them"]
    ref.stop(block=False)
    _run_drains(drains)


def test_a_message_told_from_inside_a_turn_is_queued_not_nested() -> None:
    _, drains, log, mailbox, ref = _session_recorder()
    mailbox.tell("again")
    # Handled in the same turn, after the message that told it, not inside it.
    assert [m for _, m in log] == ["again", "told from inside the turn"]
    assert ref.proxy().nested.get() == 0
    ref.stop(block=False)
    _run_drains(drains)


def test_a_handler_that_raises_on_a_told_message_stops_its_actor_as_pykka_would() -> None:
    port, drains, log, mailbox, ref = _session_recorder()
    mailbox.tell("boom")
    assert not ref.is_alive()
    # The mailbox outlives it: a later message waits for a successor.
    mailbox.tell("later")
    assert log == []
    successor = _MailboxRecorder.start(port, log, mailbox)
    _run_drains(drains)
    assert [m for _, m in log] == ["later"]
    successor.stop(block=False)
    _run_drains(drains)
