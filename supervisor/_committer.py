"""StoreCommitter: a registry's commits, written off its loop, many per round trip.

With a store that does I/O (`actors._store.BatchingStore`, e.g. the Redis
store), a session does not write its commit in its own turn: that would stall
every other session of the loop for a round trip. It hands the commit here and
holds (its effects, its reply and its later messages wait); this committer's
one thread takes every commit queued since its last write and sends them in one
`BatchingStore.commit_many` (one pipelined round trip, one script per commit),
then answers them all on the loop with one ``submit``. While a round trip is in
flight the next commits gather, so the batch grows with the load by itself
(always-on pipelining, as Centrifugo's rueidis client does).

A session has at most one commit in flight, so its commits and effects keep
their order; across sessions they batch. Each commit is answered alone: one
session's refusal touches no other. A store that cannot be reached answers
the whole batch `StoreUnavailableError` (each session undoes its transition,
as a synchronous write would).

Why a thread and not redis-py's asyncio client on the loop: the loop may be
trio's (or a door's own thread), where asyncio's streams do not run; one
thread per registry works under all of them, and its cost is one loop
``submit`` per batch, not per commit.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Sequence

from actors._errors import StoreUnavailableError
from actors._ports import LoopPort
from actors._store import BatchingStore, Commit, CommitAnswer

__all__ = ["MAX_BATCH", "StoreCommitter"]

logger = logging.getLogger("duplex_supervisor.supervisor")

#: Commits sent in one round trip at most (a longer queue takes several).
MAX_BATCH = 512


class StoreCommitter:
    """One registry's `actors._store.Committer` for a `BatchingStore`."""

    def __init__(self, store: BatchingStore, port: LoopPort, *, name: str) -> None:
        self._store = store
        self._port = port
        self._name = name
        self._queue: list[tuple[Commit, CommitAnswer]] = []
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
        with self._wake:
            if not self._closed:
                self._queue.append((commit, answer))
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._write, name=f"duplex-committer-{self._name}", daemon=True
                    )
                    self._thread.start()
                elif len(self._queue) == 1:
                    self._wake.notify()
                return
        closed = StoreUnavailableError("the registry's store committer is closed")
        self._port.submit(lambda: answer(closed))

    def in_flight(self) -> int:
        """Commits queued or being written now."""
        with self._wake:
            return len(self._queue) + self._writing

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
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                batch = self._queue[:MAX_BATCH]
                del self._queue[:MAX_BATCH]
                self._writing = len(batch)
            outcomes = self._commit_many([commit for commit, _ in batch])
            self.batches += 1
            self.commits += len(batch)
            self.largest_batch = max(self.largest_batch, len(batch))
            answers = [(a, outcome) for (_, a), outcome in zip(batch, outcomes, strict=True)]
            try:
                self._port.submit(functools.partial(_answer, answers))
            except BaseException:  # noqa: BLE001 - the loop is gone: nobody waits any more
                logger.warning("store committer %s: the loop is gone", self._name)
            with self._wake:
                self._writing = 0

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
