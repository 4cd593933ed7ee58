"""StoreCommitter: a registry's store I/O, off its loop; many commits per round trip.

With a store that does I/O (`actors._store.BatchingStore`, e.g. the Redis
store), a session does not write its commit in its own turn: that would stall
every other session of the loop for a round trip. It hands the commit here and
holds (its effects, its reply and its later messages wait); this committer's
one thread takes every commit queued since its last write and sends them in one
`BatchingStore.commit_many` (one pipelined round trip, one script per commit),
then answers them all on the loop with one ``submit``. While a round trip is in
flight the next commits gather, so the batch grows with the load by itself
(always-on pipelining, as Centrifugo's rueidis client does).

The registry's other store calls (a session's create, a delete, a
takeover's read and acquire, a sweep's lease renewals: `StoreCommitter.call`)
run on the same thread, in queue order, each answered on the loop.

A session has at most one commit in flight, so its commits and effects keep
their order; across sessions they batch. Each commit is answered alone: one
session's refusal touches no other. A store that cannot be reached answers
the whole batch `StoreUnavailableError` (each session undoes its transition,
as a synchronous write would), or `StoreOutcomeUnknownError` when the batch
had left (a reply lost): each of those sessions holds and asks for a fence
(`BatchingStore.fence`) through `StoreCommitter.call` with ``retry_for_s``,
which this thread tries again on a timer of its own while the store is away,
writing the other calls meanwhile.

Why a thread and not redis-py's asyncio client on the loop: the loop may be
trio's (or a door's own thread), where asyncio's streams do not run; one
thread per registry works under all of them, and its cost is one loop
``submit`` per batch, not per commit.
"""

from __future__ import annotations

import functools
import heapq
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from actors._errors import StoreError, StoreUnavailableError
from actors._ports import LoopPort
from actors._store import BatchingStore, Commit, CommitAnswer

__all__ = ["MAX_BATCH", "RETRY_FIRST_S", "RETRY_MAX_S", "CallAnswer", "StoreCommitter"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: Commits sent in one round trip at most (a longer queue takes several).
MAX_BATCH = 512

#: A call retried while the store is unreachable waits this long first, then
#: twice as long each time, up to `RETRY_MAX_S`.
RETRY_FIRST_S = 0.05
RETRY_MAX_S = 1.0

#: How `StoreCommitter.call` answers: the call's result, or its error.
CallAnswer = Callable[[Any, BaseException | None], None]


class _Call:
    """Another store call for the thread (a sweep's renewals, a delete)."""

    __slots__ = ("answer", "delay_s", "fn", "give_up_at", "what")

    def __init__(
        self, fn: Callable[[], Any], answer: CallAnswer | None, what: str, give_up_at: float
    ) -> None:
        self.fn = fn
        self.answer = answer
        self.what = what
        #: While the store is unreachable, tried again until then (monotonic).
        self.give_up_at = give_up_at
        self.delay_s = RETRY_FIRST_S


_Item = tuple[Commit, CommitAnswer] | _Call


class StoreCommitter:
    """One registry's `actors._store.Committer` for a `BatchingStore`."""

    def __init__(self, store: BatchingStore, port: LoopPort, *, name: str) -> None:
        self._store = store
        self._port = port
        self._name = name
        self._queue: list[_Item] = []
        #: Calls waiting to be tried again: (when, tie-breaker, call).
        self._later: list[tuple[float, int, _Call]] = []
        self._tries = 0
        self._wake = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._closed = False
        self._writing = 0
        #: Round trips made and commits sent (the batching, for tests and benchmarks).
        self.batches = 0
        self.commits = 0
        #: The most commits one round trip carried.
        self.largest_batch = 0

    def submit(self, commit: Commit, answer: CommitAnswer) -> None:
        if not self._queued((commit, answer)):
            closed = StoreUnavailableError("the registry's store committer is closed")
            self._port.submit(lambda: answer(closed))

    def call(
        self,
        fn: Callable[[], Any],
        answer: CallAnswer | None,
        *,
        what: str,
        retry_for_s: float = 0.0,
    ) -> None:
        """Run ``fn`` (a store call) on the thread, after the commits queued before it.

        ``answer(result, error)`` runs on the loop after; without one, a
        `StoreError` is logged (``what`` names the call) and the result dropped.
        ``retry_for_s`` > 0: while ``fn`` raises `StoreUnavailableError` it is
        queued again after a backoff (`RETRY_FIRST_S` doubling to
        `RETRY_MAX_S`: a timer of this thread, which writes the other calls
        meanwhile), until it answers or ``retry_for_s`` passed (or the
        committer closes): then its last error is the answer.
        """
        call = _Call(fn, answer, what, time.monotonic() + retry_for_s)
        if not self._queued(call) and answer is not None:
            closed = StoreUnavailableError("the registry's store committer is closed")
            self._port.submit(lambda: answer(None, closed))

    def _queued(self, item: _Item) -> bool:
        with self._wake:
            if not self._closed:
                self._queue.append(item)
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._write, name=f"duplex-committer-{self._name}", daemon=True
                    )
                    self._thread.start()
                elif len(self._queue) == 1:
                    self._wake.notify()
                return True
        return False

    def in_flight(self) -> int:
        """Commits (and other store calls) queued, waiting to be tried again or
        being written now."""
        with self._wake:
            return len(self._queue) + len(self._later) + self._writing

    def close(self) -> None:
        """Refuse later submits; the thread writes what is queued, then ends.

        Never waits (it is called on the loop, which answers the queued commits).
        """
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _write(self) -> None:
        while True:
            with self._wake:
                while not self._due() and not self._closed:
                    self._wake.wait(self._later[0][0] - time.monotonic() if self._later else None)
                if self._closed:  # no more waiting: what waits to be tried again, now
                    self._queue += [call for _, _, call in self._later]
                    self._later.clear()
                if not self._queue:
                    return
                head = self._queue[0]
                if isinstance(head, _Call):
                    del self._queue[0]
                    self._writing = 1
                    batch: list[tuple[Commit, CommitAnswer]] = []
                else:
                    batch = self._take_commits()
                    self._writing = len(batch)
            answer = self._call(head) if isinstance(head, _Call) else self._write_batch(batch)
            with self._wake:
                self._writing = 0  # done: before its answers, so none sees it in flight
            if answer is not None:
                self._answer_on_loop(answer)

    def _due(self) -> bool:
        """Whether something is queued, once the retries whose time came are."""
        now = time.monotonic()
        while self._later and self._later[0][0] <= now:
            self._queue.append(heapq.heappop(self._later)[2])
        return bool(self._queue)

    def _later_again(self, call: _Call, error: BaseException) -> bool:
        """Queue ``call`` to be tried again after its backoff, if it may be."""
        if not isinstance(error, StoreUnavailableError):
            return False
        due = time.monotonic() + call.delay_s
        with self._wake:
            if self._closed or due > call.give_up_at:
                return False
            call.delay_s = min(RETRY_MAX_S, call.delay_s * 2)
            self._tries += 1
            heapq.heappush(self._later, (due, self._tries, call))
        return True

    def _take_commits(self) -> list[tuple[Commit, CommitAnswer]]:
        """The commits at the head of the queue (up to `MAX_BATCH`), taken out."""
        batch: list[tuple[Commit, CommitAnswer]] = []
        for item in self._queue:
            if isinstance(item, _Call) or len(batch) == MAX_BATCH:
                break
            batch.append(item)
        del self._queue[: len(batch)]
        return batch

    def _call(self, call: _Call) -> Callable[[], object] | None:
        result: Any = None
        error: BaseException | None = None
        try:
            result = call.fn()
        except BaseException as exc:  # noqa: BLE001 - answered, or logged below
            error = exc
            if self._later_again(call, exc):
                return None
        if call.answer is not None:
            return functools.partial(call.answer, result, error)
        if isinstance(error, StoreError):
            logger.warning("store committer %s: %s failed (%s)", self._name, call.what, error)
        elif error is not None:
            logger.error("store committer %s: %s failed: %r", self._name, call.what, error)
        return None

    def _write_batch(self, batch: list[tuple[Commit, CommitAnswer]]) -> Callable[[], object]:
        outcomes = self._commit_many([commit for commit, _ in batch])
        self.batches += 1
        self.commits += len(batch)
        self.largest_batch = max(self.largest_batch, len(batch))
        answers = [(a, outcome) for (_, a), outcome in zip(batch, outcomes, strict=True)]
        return functools.partial(_answer, answers)

    def _answer_on_loop(self, fn: Callable[[], object]) -> None:
        try:
            self._port.submit(fn)
        except BaseException:  # noqa: BLE001 - the loop is gone: nobody waits any more
            logger.warning("store committer %s: the loop is gone", self._name)

    def _commit_many(self, commits: Sequence[Commit]) -> Sequence[BaseException | None]:
        try:
            outcomes = self._store.commit_many(commits)
        except BaseException as exc:  # noqa: BLE001 - every commit of the batch gets it
            return [exc] * len(commits)
        if len(outcomes) != len(commits):
            error = RuntimeError("the store answered a different number of commits")
            return [error] * len(commits)
        return outcomes


def _answer(answers: list[tuple[CommitAnswer, BaseException | None]]) -> None:
    for answer, outcome in answers:
        try:
            answer(outcome)
        except Exception:  # one session's trouble must not cost the others
            logger.exception("store committer: answering a commit failed")
