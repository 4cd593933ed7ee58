"""Who owns a session in the store: every store call a registry makes, in one place.

A session actor and the supervisor both persist through `StoreOwnership`,
one per registry: a session's create, the fence of a commit whose answer was
lost, the check that this process still holds a lease, a takeover (adopting a
session another process wrote), a sweep's lease renewals and the delete of a
session that closed or expired, live or parked. A transition's commit is
written through the session's `StoreBinding` (`actors._store_binding`), which this
module hands out.

With a store that does I/O (a `BatchingStore`) each call goes to the
registry's `Committer`, off the loop and after the commits queued before it,
and its answer comes back later on the loop; with the in-memory store it is
made in the caller's turn (no I/O). Either way the caller learns the same
answer, so neither shell writes the two paths itself.

No pykka, no threads: plain calls on the store and the committer.
"""

from __future__ import annotations

import functools
import logging
import secrets
import time
from collections.abc import Callable, Sequence
from typing import cast

from actors._errors import StoreError
from actors._store import (
    DEFAULT_LEASE_S,
    BatchingStore,
    Committer,
    SessionRecord,
    SessionStore,
    StoredSession,
    proves_token,
)
from actors._store_binding import StoreBinding

__all__ = ["Renewals", "StoreOwnership", "Takeover"]

logger = logging.getLogger("duplex_supervisor.actors")

#: A takeover's outcome: the session's fields (``None``: not stored), and the
#: session taken over (``None``: the token proved nothing).
Takeover = tuple[StoredSession | None, StoredSession | None]

#: A sweep's renewals, one per lease: ``True``, ``False`` (another process
#: owns it) or the store's error for that lease (kept, tried again).
Renewals = tuple[bool | StoreError, ...]

#: An answer from the committer, on the loop: the call's result, or its error.
Answer = Callable[[object, BaseException | None], None]


class StoreOwnership:
    """One registry's side of the store (see the module): ``committer`` None
    means each call is made in the caller's turn."""

    __slots__ = ("_clock", "committer", "registry_id", "store")

    def __init__(
        self,
        *,
        store: SessionStore,
        committer: Committer | None,
        clock: Callable[[], float],
        registry_id: str,
    ) -> None:
        self.store = store
        self.committer = committer
        self._clock = clock
        self.registry_id = registry_id

    @property
    def lease_s(self) -> float:
        """How long the store keeps an owner's lease without a write."""
        return float(getattr(self.store, "lease_s", DEFAULT_LEASE_S))

    def wall_offset(self) -> float:
        """``time.time() - clock()`` now: the store keeps wall-clock times."""
        return time.time() - self._clock()

    # -- a session's own lease -------------------------------------------------------

    def create(self, session_id: str, record: SessionRecord) -> StoreBinding:
        """Store a new session now (no committer); its binding, or the store's error."""
        return self.bind(session_id, self.store.create(session_id, record), record)

    def create_later(
        self, session_id: str, record: SessionRecord, answer: Answer, *, retry_for_s: float = 0.0
    ) -> None:
        """Store a new session off the loop; ``answer(epoch, error)`` later."""
        committer = self._committer()
        create = functools.partial(self.store.create, session_id, record)
        committer.call(create, answer, what="create", retry_for_s=retry_for_s)

    def bind(self, session_id: str, epoch: int, record: SessionRecord) -> StoreBinding:
        """The session's link to the store at ``epoch``, ``record`` last written."""
        return StoreBinding(
            store=self.store, session_id=session_id, epoch=epoch, record=record, clock=self._clock
        )

    def fence(
        self,
        binding: StoreBinding,
        answer: Callable[[StoredSession | None, BaseException | None], None],
    ) -> None:
        """Have the store fence ``binding``'s commit in doubt (`BatchingStore.fence`),
        tried again while the store is away, up to the lease: past it this
        owner cannot keep the session anyway."""
        committer, store = self._committer(), self.store
        assert isinstance(store, BatchingStore)  # noqa: S101 - only a batching store loses answers
        session_id = binding.session_id
        fence = functools.partial(store.fence, session_id, binding.epoch, secrets.token_hex(8))

        def fenced(stored: object, error: BaseException | None) -> None:
            answer(stored if isinstance(stored, StoredSession) else None, error)

        what = f"session {session_id}: fence"
        committer.call(fence, fenced, what=what, retry_for_s=self.lease_s)

    def taken_over(self, binding: StoreBinding) -> bool:
        """Whether the store says another process owns ``binding``'s session now."""
        try:
            return not self.store.renew(binding.session_id, binding.epoch)
        except StoreError:
            return False  # the store cannot say: answer as this process knows it

    def delete(self, session_id: str, epoch: int) -> None:
        """A session that closed or expired leaves the store too (if ``epoch`` still owns it)."""
        committer = self.committer
        if committer is not None:  # off the loop, after the session's last commit
            delete = functools.partial(self.store.delete, session_id, epoch)
            committer.call(delete, None, what=f"session {session_id}: store delete")
            return
        try:
            self.store.delete(session_id, epoch)
        except StoreError as exc:
            # Its keys expire by themselves (the store's key TTL).
            logger.warning("session %s: store delete failed (%s)", session_id, exc)

    # -- the supervisor's: other processes' sessions, and every lease held -------------

    def take_over(self, session_id: str, resume_token: str) -> Takeover:
        """Take a session over for a resume that proves its token, now.

        The token is checked against the stored digest first, so a wrong
        token never ends the owner's lease; the takeover itself is the
        store's compare-and-set on that digest, with a new epoch that fences
        the old owner. Raises the store's error.
        """
        stored = self.store.load(session_id, events=False)  # the acquire reads them
        digest = None if stored is None else proves_token(stored, resume_token)
        taken = None if digest is None else self.store.acquire(session_id, digest)
        return stored, taken

    def take_over_later(self, session_id: str, resume_token: str, answer: Answer) -> None:
        """`take_over` off the loop; ``answer(outcome, error)`` later."""
        take = functools.partial(self.take_over, session_id, resume_token)
        self._committer().call(take, answer, what=f"session {session_id}: takeover")

    def renew(self, leases: Sequence[tuple[str, int]]) -> Renewals | None:
        """Renew ``leases`` now; ``None``: the store is away (the next sweep tries again)."""
        try:
            return tuple(self.store.renew_many(leases))
        except StoreError:
            return None

    def renew_later(
        self, leases: Sequence[tuple[str, int]], answer: Callable[[Renewals | None], None]
    ) -> None:
        """`renew` off the loop; ``answer(renewals)`` later (``None``: not answered)."""

        def renewed(renewals: object, error: BaseException | None) -> None:
            if error is not None and not isinstance(error, StoreError):
                logger.error("registry %s: lease renewal failed: %r", self.registry_id, error)
            kept = None if error is not None else cast(Sequence[bool | StoreError], renewals)
            answer(None if kept is None else tuple(kept))

        renew = functools.partial(self.store.renew_many, leases)
        self._committer().call(renew, renewed, what="lease renewal")

    def _committer(self) -> Committer:
        committer = self.committer
        assert committer is not None  # noqa: S101 - the off-loop calls need one
        return committer
