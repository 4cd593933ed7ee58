"""StoreOwnership with plain calls: every store call a registry makes, both ways.

No actor, no thread, no loop: a `MemoryStore` on a fake clock, and for the
off-loop path a committer that records its calls and runs them when told.
What a session actor and the supervisor do with the answers is tested
through them (test_redis_takeover, test_redis_lost_reply, test_gateway_store).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from actors._errors import StoreUnavailableError
from actors._ownership import StoreOwnership
from actors._store import Commit, CommitAnswer, SessionStore
from supervisor.stores._memory import MemoryStore
from tests.helpers import FakeClock
from tests.test_redis_store import record


class _Committer:
    """Keeps each call until `run` (the registry's committer answers later, on the loop)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Callable[[], object], object, float]] = []

    def submit(self, commit: Commit, answer: CommitAnswer) -> None:
        raise AssertionError("no commit goes through StoreOwnership")

    def call(
        self,
        fn: Callable[[], object],
        answer: Callable[[object, BaseException | None], None] | None,
        *,
        what: str,
        retry_for_s: float = 0.0,
    ) -> None:
        self.calls.append((what, fn, answer, retry_for_s))

    def run(self) -> None:
        calls, self.calls = self.calls, []
        for _, fn, answer, _ in calls:
            try:
                result: object = fn()
            except Exception as exc:  # handed to the answer, as the committer does
                if callable(answer):
                    answer(None, exc)
            else:
                if callable(answer):
                    answer(result, None)


class _Away(MemoryStore):
    """A store that cannot be reached for renewals."""

    def renew(self, session_id: str, epoch: int) -> bool:
        raise StoreUnavailableError("away")

    def renew_many(self, leases: object) -> list[bool | StoreUnavailableError]:
        raise StoreUnavailableError("away")


def _ownership(
    store: SessionStore, committer: _Committer | None = None, clock: FakeClock | None = None
) -> StoreOwnership:
    return StoreOwnership(
        store=store, committer=committer, clock=clock or FakeClock(), registry_id="r"
    )


def test_a_wrong_token_takes_nothing_over_and_the_owner_keeps_its_lease() -> None:
    store = MemoryStore(clock=FakeClock())
    owner = _ownership(store).create("s", record("right"))
    stored, taken = _ownership(store).take_over("s", "wrong")
    assert stored is not None and taken is None
    assert store.renew("s", owner.epoch)  # still the owner's


def test_a_takeover_with_the_token_fences_the_old_owner() -> None:
    store = MemoryStore(clock=FakeClock())
    ownership = _ownership(store)
    owner = ownership.create("s", record("right"))
    assert not ownership.taken_over(owner)
    stored, taken = _ownership(store).take_over("s", "right")
    assert stored is not None and taken is not None and taken.epoch == owner.epoch + 1
    assert ownership.taken_over(owner)
    assert _ownership(store).take_over("nowhere", "right") == (None, None)


def test_a_takeover_off_the_loop_answers_the_same_once_the_committer_ran() -> None:
    store, committer = MemoryStore(clock=FakeClock()), _Committer()
    _ownership(store).create("s", record("right"))
    answers: list[tuple[object, BaseException | None]] = []
    _ownership(store, committer).take_over_later(
        "s", "right", lambda outcome, error: answers.append((outcome, error))
    )
    assert answers == [] and [what for what, *_ in committer.calls] == ["session s: takeover"]
    committer.run()
    [(outcome, error)] = answers
    assert error is None
    assert isinstance(outcome, tuple) and outcome[1] is not None and outcome[1].epoch == 2


def test_a_delete_needs_the_owners_epoch_either_way() -> None:
    store, committer = MemoryStore(clock=FakeClock()), _Committer()
    ownership = _ownership(store)
    ownership.create("s", record())
    ownership.delete("s", 7)  # not the owner's epoch: nothing
    assert store.load("s") is not None
    _ownership(store, committer).delete("s", 1)
    assert store.load("s") is not None  # with the committer, after what is queued before it
    committer.run()
    assert store.load("s") is None


def test_renewals_answer_each_lease_and_none_when_the_store_is_away() -> None:
    store = MemoryStore(clock=FakeClock())
    ownership = _ownership(store)
    ownership.create("a", record())
    ownership.create("b", record())
    assert ownership.renew([("a", 1), ("b", 2)]) == (True, False)
    assert _ownership(_Away(clock=FakeClock())).renew([("a", 1)]) is None


def test_renewals_off_the_loop_give_none_on_an_error() -> None:
    answers: list[object] = []
    committer = _Committer()
    _ownership(_Away(clock=FakeClock()), committer).renew_later([("a", 1)], answers.append)
    committer.run()
    assert answers == [None]
    store = MemoryStore(clock=FakeClock())
    store.create("a", record())
    _ownership(store, committer).renew_later([("a", 1)], answers.append)
    committer.run()
    assert answers == [None, (True,)]


def test_a_lease_check_the_store_cannot_answer_keeps_the_session() -> None:
    store = _Away(clock=FakeClock())
    binding = _ownership(store).create("s", record())
    assert not _ownership(store).taken_over(binding)


def test_the_off_loop_calls_need_a_committer() -> None:
    with pytest.raises(AssertionError):
        _ownership(MemoryStore()).take_over_later("s", "t", lambda outcome, error: None)
