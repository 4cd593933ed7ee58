"""A live session's link to the store: its binding, and the one write in flight.

The session actor's side of persistence (its store calls are
`StoreOwnership`'s). A transition is released only once it is durable:

* with the in-memory store the commit is written in the actor's turn;
* with a store that does I/O the commit (and a new session's create) goes to
  the registry's `Committer`, and the session holds every later message until
  the answer comes back as a `Committed` message; then the transition is
  carried out, or undone on a refusal. One write in flight per session keeps
  its order.

A write whose answer was lost (`StoreOutcomeUnknownError`) is neither
carried out nor undone: the session goes on holding and has the store fence it
(`Fenced`), then keeps or undoes it as the store says (`StoreBinding.settle`).

The link decides nothing about the session: it tells its `StoreLinkHost` (the
actor) to carry a transition out, or that the store refused it.
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from dataclasses import dataclass, field, replace
from typing import Protocol

from actors._errors import (
    SessionReplacedError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
)
from actors._mailbox import InboxClosedError, SessionMailbox
from actors._ownership import StoreOwnership
from actors._state import SessionState, Transition
from actors._store import SessionRecord, StoredSession
from actors._store_binding import StoreBinding
from actors._supervisor_mail import Call, Committed, Fenced

__all__ = ["StoreLink", "StoreLinkHost"]

logger = logging.getLogger("duplex_supervisor.actors")


class StoreLinkHost(Protocol):
    """What a `StoreLink` hands back to its session actor, in the actor's turns."""

    def opened(self, state: SessionState, created: Transition) -> None:
        """The new session is stored (or needs no store): go live."""

    def create_failed(self, failure: BaseException) -> None:
        """The store refused the new session: answer the caller and leave."""

    def carry_out(self, call: Call, transition: Transition) -> None:
        """``transition`` is durable (or needs no write): release it."""

    def refused(self, call: Call, transition: Transition, exc: BaseException) -> None:
        """The store refused ``transition``'s write: undo it and answer why."""

    def go_on(self) -> None:
        """The write in flight was answered: run what waited for it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Creating:
    """A new session whose create the store has not answered yet."""

    state: SessionState = field(repr=False)
    created: Transition = field(repr=False)
    record: SessionRecord = field(repr=False)
    #: Its first answer was lost: sent again until the store answers.
    again: bool = False


class StoreLink:
    """One session actor's link to the store (``ownership`` None: memory only)."""

    __slots__ = ("_fencing", "_host_ref", "_mailbox", "_ownership", "binding", "in_flight")

    def __init__(
        self, ownership: StoreOwnership | None, mailbox: SessionMailbox, host: StoreLinkHost
    ) -> None:
        self._ownership = ownership
        self._mailbox = mailbox
        # Weakly: the host (the actor) holds this link, and a strong reference
        # back made each parked or ended session's whole actor graph garbage
        # only the cycle collector could free (~11 objects per session). A
        # `weakref.ref`, not a proxy: a dead proxy raises ReferenceError at
        # the isinstance of anyone walking gc.get_objects().
        self._host_ref = weakref.ref(host)
        #: This session's epoch and last write (None: not stored by this process).
        self.binding: StoreBinding | None = None
        #: A write the store has not answered yet (the commit, or the session's
        #: create): its effects and reply wait, and so does every later message.
        self.in_flight: tuple[Call, Transition] | _Creating | None = None
        # The commit in flight whose answer was lost, while the store fences it.
        self._fencing: tuple[Call, Transition] | None = None

    @property
    def _host(self) -> StoreLinkHost:
        host = self._host_ref()
        # The link is only called in its host's turns, while the host lives.
        assert host is not None  # noqa: S101
        return host

    # -- the session's create, and taking up an epoch ----------------------------------

    def open(self, state: SessionState, created: Transition) -> None:
        """Store a new session (if there is a store), then `StoreLinkHost.opened`
        (or `StoreLinkHost.create_failed`), now or once the store answered."""
        ownership = self._ownership
        if ownership is None:
            self._host.opened(state, created)
            return
        session_id = self._mailbox.session_id
        if ownership.committer is not None:
            # Created in the store off the loop; everything waits for the answer.
            record = state.store_record(ownership.wall_offset())
            self.in_flight = _Creating(state=state, created=created, record=record)
            ownership.create_later(session_id, record, self._create_answered)
            return
        try:
            self._bound(ownership.create(session_id, state.store_record(ownership.wall_offset())))
        except BaseException as exc:  # noqa: BLE001 - a duplicate id, Redis down: caller's
            self._host.create_failed(exc)
            return
        self._host.opened(state, created)

    def rebind(self, state: SessionState) -> None:
        """A woken session takes up the epoch its mailbox holds (a takeover's,
        or an earlier actor's)."""
        ownership, epoch = self._ownership, self._mailbox.store_epoch
        if ownership is not None and epoch is not None:
            record = state.store_record(ownership.wall_offset())
            self._bound(ownership.bind(self._mailbox.session_id, epoch, record))

    def _bound(self, binding: StoreBinding) -> None:
        self._mailbox.store_epoch = binding.epoch
        self.binding = binding

    def _create_answered(self, epoch: object, error: BaseException | None) -> None:
        """Called on the loop by the committer: the store's create, as a message."""
        with contextlib.suppress(InboxClosedError):
            self._mailbox.tell(
                Committed(error=error, epoch=epoch if isinstance(epoch, int) else None)
            )

    # -- a transition's commit ---------------------------------------------------------

    def write(self, call: Call, transition: Transition, state: SessionState) -> None:
        """Make ``transition`` durable (``binding`` is set), then carry it out:
        now, or once the committer answered (`committed`); a refusal goes to
        `StoreLinkHost.refused` with nothing of it released."""
        binding, ownership = self.binding, self._ownership
        assert binding is not None and ownership is not None  # noqa: S101
        committer = ownership.committer
        if committer is None:
            try:
                binding.commit(state)
            except BaseException as exc:  # noqa: BLE001 - sorted out by the host
                self._host.refused(call, transition, exc)
                return
            self._host.carry_out(call, transition)
            return
        # Handed to the committer; everything is held until its answer
        # (`Committed`), so nothing of it is released before it is durable
        # and this session's commits stay in order.
        try:
            commit = binding.prepare(state)
        except BaseException as exc:  # noqa: BLE001 - a bug: a crash of this call
            self._host.refused(call, transition, exc)
            return
        if commit is None:
            self._host.carry_out(call, transition)
            return
        self.in_flight = (call, transition)
        committer.submit(commit, self._commit_answered)

    def _commit_answered(self, error: BaseException | None) -> None:
        """Called on the loop by the committer: the answer, as a message."""
        # A session already gone (a shutdown that could not wait) has nothing to undo.
        with contextlib.suppress(InboxClosedError):
            self._mailbox.tell(Committed(error=error))

    def committed(self, message: Committed) -> None:
        """The store answered the write in flight."""
        in_flight, self.in_flight = self.in_flight, None
        ownership = self._ownership
        if isinstance(in_flight, _Creating):
            assert ownership is not None  # noqa: S101 - only a store answers a create
            if isinstance(message.error, StoreOutcomeUnknownError) and not in_flight.again:
                # The same record again (its token digest is this create's own:
                # the store answers a create it applied already as created),
                # until the store answers or the lease passed.
                self.in_flight = replace(in_flight, again=True)
                ownership.create_later(
                    self._mailbox.session_id,
                    in_flight.record,
                    self._create_answered,
                    retry_for_s=ownership.lease_s,
                )
                return
            if message.error is not None or message.epoch is None:
                self._host.create_failed(message.error or RuntimeError("the store gave no epoch"))
                return
            self._bound(ownership.bind(self._mailbox.session_id, message.epoch, in_flight.record))
            self._host.opened(in_flight.state, in_flight.created)
        elif in_flight is not None:
            call, transition = in_flight
            binding = self.binding
            assert binding is not None  # noqa: S101 - only let_go clears it, never in flight
            if message.error is None:
                binding.confirm()
                self._host.carry_out(call, transition)
            elif isinstance(message.error, StoreOutcomeUnknownError):
                # Applied or not, nobody knows: neither released nor undone
                # (either could contradict the store), and the session holds
                # until the store says which.
                self.in_flight = self._fencing = in_flight
                assert ownership is not None  # noqa: S101 - bound: there is a store
                ownership.fence(binding, self._fence_answered)
                return
            else:
                self._host.refused(call, transition, message.error)
        self._host.go_on()

    # -- a commit whose answer was lost ------------------------------------------------

    def _fence_answered(self, stored: StoredSession | None, error: BaseException | None) -> None:
        with contextlib.suppress(InboxClosedError):
            self._mailbox.tell(Fenced(stored=stored, error=error))

    def fenced(self, message: Fenced) -> None:
        """The store fenced the commit in doubt: keep it or undo it as it says."""
        fencing, self._fencing = self._fencing, None
        binding = self.binding
        if fencing is None or binding is None:
            return  # nothing in doubt (cannot happen: one fence per commit in flight)
        self.in_flight = None
        call, transition = fencing
        if message.stored is not None:
            self._mailbox.store_epoch = message.stored.epoch
            if binding.settle(message.stored):
                self._host.carry_out(call, transition)  # applied: its effects go out once
            else:
                self._host.refused(
                    call, transition, StoreUnavailableError("the store did not apply the write")
                )
        elif isinstance(message.error, StoreUnavailableError):
            logger.warning(
                "session %s: a write's outcome stayed unknown past the store's lease; "
                "letting go (the stored copy stands, a resume takes it over)",
                self._mailbox.session_id,
            )
            self._host.refused(call, transition, SessionReplacedError(self._mailbox.session_id))
        else:
            self._host.refused(
                call, transition, message.error or RuntimeError("a fence gave nothing")
            )
        self._host.go_on()

    def waiting_out_an_outage(self) -> bool:
        """Whether a write whose answer was lost is being tried until the store answers."""
        creating = self.in_flight
        return self._fencing is not None or (isinstance(creating, _Creating) and creating.again)

    def abandon(self) -> Call | None:
        """Stop waiting for the write in flight (a shutdown does not wait out an
        outage: the write stays as the store has it, and its answer finds the
        session gone); the call whose commit it was (None: the create's)."""
        fencing = self._fencing
        self.in_flight = self._fencing = None
        return None if fencing is None else fencing[0]

    # -- the lease ---------------------------------------------------------------------

    def holds(self, epoch: int) -> bool:
        """Whether this session is bound at ``epoch``."""
        return self.binding is not None and self.binding.epoch == epoch

    def taken_over(self) -> bool:
        """Whether the store says another process owns this session now."""
        binding, ownership = self.binding, self._ownership
        return binding is not None and ownership is not None and ownership.taken_over(binding)

    def let_go(self) -> None:
        """Another process owns the session: this one writes no more."""
        self.binding = None

    def forget(self) -> None:
        """The session closed: it leaves the store too (if this process still owns it)."""
        binding, self.binding = self.binding, None
        if binding is not None and self._ownership is not None:
            self._ownership.delete(binding.session_id, binding.epoch)
