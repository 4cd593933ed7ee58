"""Ordering through the real actors: concurrent senders, and crash isolation."""

from __future__ import annotations

import functools
import threading

import pytest

from actors._errors import SessionCrashedError
from supervisor._faults import FaultPlan
from tests.actor_support import WAIT, Background, Wire, registry

SENDERS = 8
PER_SENDER = 50


def test_concurrent_senders_keep_their_own_order_and_dense_sequences() -> None:
    with registry() as reg:
        wire = Wire()
        reg.create("s", send=wire.send_blocking, close=wire.close_blocking)
        start = threading.Barrier(SENDERS)

        def sender(k: int) -> list[int]:
            start.wait(WAIT)
            seqs = []
            for i in range(PER_SENDER):
                entry = reg.send_event("s", {"k": k, "i": i})
                assert entry is not None
                seqs.append(entry.sequence)
            return seqs

        calls = [Background(functools.partial(sender, k)) for k in range(SENDERS)]
        answered = [call.result() for call in calls]
        total = SENDERS * PER_SENDER
        assert sorted(s for seqs in answered for s in seqs) == list(range(1, total + 1))
        frames = list(wire.frames)
        assert [f["server_event_seq"] for f in frames] == list(range(1, total + 1))
        for k in range(SENDERS):
            mine = [f for f in frames if f["k"] == k]
            assert [f["i"] for f in mine] == list(range(PER_SENDER))
            assert [f["server_event_seq"] for f in mine] == answered[k]


def test_a_crash_in_one_of_100_sessions_leaves_the_others_untouched() -> None:
    plan = FaultPlan()
    with registry(faults=plan) as reg:
        wires = {f"s{n}": Wire() for n in range(100)}
        for sid, wire in wires.items():
            reg.create(sid, send=wire.send_blocking, close=wire.close_blocking)
        plan.crash("send_event.recorded", session_id="s42", times=3)
        for round_ in range(5):
            for sid in wires:
                if sid == "s42" and round_ < 3:
                    with pytest.raises(SessionCrashedError):
                        reg.send_event(sid, {"r": round_})
                    continue
                entry = reg.send_event(sid, {"r": round_})
                assert entry is not None
        for sid, wire in wires.items():
            if sid == "s42":
                assert wire.sequences() == [1, 2]
                assert [f["r"] for f in list(wire.frames)] == [3, 4]
            else:
                assert wire.sequences() == [1, 2, 3, 4, 5]
                assert [f["r"] for f in list(wire.frames)] == [0, 1, 2, 3, 4]
            assert reg.has_attachment(sid) is True
            assert wire.closes == []
        stats = reg.stats()
        assert stats.sessions == 100
        assert stats.crashes == 3
        assert stats.events_journaled == 99 * 5 + 2
