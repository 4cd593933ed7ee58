"""What an idle session costs the trio door's loop: no pump task until its
first send, and no wake-up socket write for what the loop tells itself."""

from __future__ import annotations

import gc
import threading
from collections import Counter

import trio

from supervisor.doors._loop_port import CoalescingPort
from supervisor.doors._trio import LocalDrain
from supervisor.testing import FakeClock
from tests.trio_support import LIMIT, TokenCatcher, Wire, registry


def _task_names() -> list[str]:
    names: list[str] = []
    root = trio.lowlevel.current_root_task()
    assert root is not None
    todo = [root]
    while todo:
        task = todo.pop()
        names.append(task.name)
        todo.extend(t for nursery in task.child_nurseries for t in nursery.child_tasks)
    return names


def _pumps() -> list[str]:
    return [name for name in _task_names() if name.startswith("duplex-outbox:")]


async def test_a_session_never_sent_to_never_starts_a_pump() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            wire = Wire()
            await reg.create("quiet", send=wire.send, close=wire.close)
            await trio.testing.wait_all_tasks_blocked()
            assert _pumps() == []
            await reg.detach("quiet")
            await trio.testing.wait_all_tasks_blocked()
            assert _pumps() == []
            await reg.create("busy", send=wire.send, close=wire.close)
            assert await reg.send_event("busy", {"n": 1}) is not None
            assert _pumps() == ["duplex-outbox:busy"]
            assert wire.seqs() == [1]


async def test_an_outbox_replaced_before_any_send_never_starts_a_pump() -> None:
    with trio.fail_after(LIMIT):
        async with registry() as reg:
            old, new = Wire(), Wire()
            created = await reg.create("s", send=old.send, close=old.close)
            await trio.testing.wait_all_tasks_blocked()
            assert _pumps() == []
            resumed = await reg.resume(
                "s",
                resume_token=created.resume_token.plaintext,
                last_received_server_event_seq=0,
                send=new.send,
                close=new.close,
                activation_payload_factory=TokenCatcher(),
            )
            assert resumed.replaced_attachment is not None
            await trio.testing.wait_all_tasks_blocked()
            # Only the new attachment's pump (it sent the activation) ran.
            assert len(_pumps()) == 1
            assert old.frames == [] and len(new.frames) == 1


async def test_a_submit_from_the_loop_wakes_the_drain_task_without_run_sync_soon() -> None:
    token = trio.lowlevel.current_trio_token()
    scheduled: list[object] = []

    def schedule(fn: object) -> None:
        scheduled.append(fn)
        token.run_sync_soon(fn)  # type: ignore[arg-type]

    drainer = LocalDrain()
    port = CoalescingPort(schedule, drainer.schedule)
    ran: list[str] = []
    with trio.fail_after(LIMIT):
        # Before the drain task runs, a submit falls back to ``schedule``.
        port.submit(lambda: ran.append("before"))
        assert len(scheduled) == 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(drainer.run)
            while ran != ["before"]:
                await trio.sleep(0)
            await trio.testing.wait_all_tasks_blocked()
            port.submit(lambda: ran.append("here 1"))
            port.submit(lambda: ran.append("here 2"))
            while len(ran) < 3:
                await trio.sleep(0)
            assert len(scheduled) == 1  # the loop's own submits used no socket write
            # Another thread's submit still goes through ``schedule``.
            await trio.to_thread.run_sync(lambda: port.submit(lambda: ran.append("thread")))
            while len(ran) < 4:
                await trio.sleep(0)
            assert len(scheduled) == 2
            nursery.cancel_scope.cancel()
    assert ran == ["before", "here 1", "here 2", "thread"]
    assert threading.get_ident() == port.loop_thread_id


async def _send(frame: object) -> None:
    return None


async def _close(reason: str) -> None:
    return None


def _tracked() -> Counter[str]:
    gc.collect()
    return Counter(type(o).__qualname__ for o in gc.get_objects())


async def test_a_parked_session_keeps_two_objects_for_the_garbage_collector() -> None:
    # Each full collection walks every object a parked session keeps: with
    # 100,000 of them those walks were half the time it took to make them.
    # Its mailbox and ParkedSession stay (the journal's data are the parked
    # session's own fields; the mailbox's lock is its registry's); no deque,
    # no stopped-event condition, no outbox's own parts.
    batch = 50
    clock = FakeClock()
    with trio.fail_after(LIMIT):
        async with registry(clock=clock, passivate_after_s=10.0) as reg:

            async def park_a_batch(first: int) -> Counter[str]:
                for n in range(first, first + batch):
                    await reg.create(f"s{n}", send=_send, close=_close)
                    await reg.detach(f"s{n}")
                clock.advance(11.0)
                await reg.sweep()
                while reg.stats().parked < first + batch:
                    await trio.sleep(0)
                await trio.testing.wait_all_tasks_blocked()
                return _tracked()

            await park_a_batch(0)
            once = await park_a_batch(batch)
            # The second batch's growth: the loop's own fixed costs cancel out.
            grown = await park_a_batch(2 * batch) - once
            # Retired outboxes leave the registry's drain list in amortized
            # batches (at its next growth), not at once: not a parked cost.
            del grown["TrioOutbox"]
            assert sum(grown.values()) <= 2 * batch + 8, grown.most_common(8)


async def test_a_live_session_keeps_no_snapshot_of_its_last_command() -> None:
    # A command's snapshot is there to undo it if its store write fails; kept
    # until the next command, it held four objects per live session (both
    # snapshots, the fields and the attachment from before the command) that
    # every full collection walked while a batch of sessions waited to park.
    batch = 50
    with trio.fail_after(LIMIT):
        async with registry() as reg:

            async def open_a_batch(first: int) -> Counter[str]:
                for n in range(first, first + batch):
                    await reg.create(f"s{n}", send=_send, close=_close)
                    await reg.detach(f"s{n}")
                await trio.testing.wait_all_tasks_blocked()
                return _tracked()

            await open_a_batch(0)
            once = await open_a_batch(batch)
            grown = await open_a_batch(2 * batch) - once
            assert grown["SessionState"] == batch  # live, not parked
            assert grown["StateSnapshot"] == 0, grown.most_common(8)
            assert grown["JournalSnapshot"] == 0
            assert grown["SessionFields"] == batch  # the current ones only
            assert grown["TransportAttachment"] == 0  # detached: the old one is let go
