"""The supervisor's side of the store: sessions taken over, leases kept or let go.

A registry given a store shares its sessions with other processes. Here, in
the supervisor's turns:

* **Takeover.** A resume for a session this process does not hold (`Adopt`)
  is looked up in the store; if its token proves the stored digest, the
  session is taken over (a new epoch that fences the old owner) and routed
  here parked: the resume wakes it. The store's calls are `StoreOwnership`'s
  (`actors._ownership`), made off the loop when the store does I/O, with the
  answer back as `Adopted`; resumes that arrive meanwhile wait for it.
* **Leases.** Each sweep renews the lease of every session this process
  holds; one the store refuses was taken over elsewhere: a parked session is
  closed here, a live one told `Replaced` (it lets go itself).
* **Delete.** A parked session that expired leaves the store too.

`persistence` builds what a registry with a store starts with: its
`StoreOwnership`, and its committer if the store does I/O.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol, cast

from actors._commands import AuthenticateResume, LifecycleEvent, Resume
from actors._errors import InvalidResumeTokenError, StoreError
from actors._lifecycle import ParkedSession
from actors._mailbox import InboxClosedError, SessionMailbox
from actors._ownership import Renewals, StoreOwnership, Takeover
from actors._ports import LoopPort, Reply
from actors._store import BatchingStore, SessionStore, parked_from_store
from actors._supervisor_machine import SupervisorMachine, TakeOver, WaitForTakeover
from actors._supervisor_mail import Call, Replaced, answer_unknown
from supervisor._system_books import Adopt, Adopted, Books, LeasesRenewed
from supervisor.stores._committer import StoreCommitter

__all__ = ["Leases", "LeasesHost", "persistence"]

logger = logging.getLogger("duplex_supervisor.supervisor")


def persistence(
    store: SessionStore | None, port: LoopPort, clock: Callable[[], float], registry_id: str
) -> tuple[StoreCommitter | None, StoreOwnership | None]:
    """A registry's committer (a store that does I/O only) and its `StoreOwnership`."""
    if store is None:
        return None, None
    committer = (
        StoreCommitter(store, port, name=registry_id) if isinstance(store, BatchingStore) else None
    )
    ownership = StoreOwnership(
        store=store, committer=committer, clock=clock, registry_id=registry_id
    )
    return committer, ownership


class LeasesHost(Protocol):
    """The supervisor as `Leases` sees it (`supervisor._system.SessionSystem`)."""

    machine: SupervisorMachine[Call]
    books: Books
    #: Guards every session mailbox of the registry (`SessionMailboxOwner`).
    mailbox_lock: threading.Lock

    @property
    def routes(self) -> dict[str, SessionMailbox]:
        """The routing table (written only in the supervisor's turns)."""

    def wake(self, mailbox: SessionMailbox) -> None: ...

    def file_parked(self, mailbox: SessionMailbox, parked: ParkedSession) -> None: ...

    def unroute(self, mailbox: SessionMailbox) -> None: ...

    def notify(self, event: LifecycleEvent) -> None: ...

    def tell_supervisor(self, message: object, reply: Reply | None = None) -> None: ...


class Leases:
    """Takeovers and lease renewals for one registry (see the module)."""

    def __init__(self, host: LeasesHost, ownership: StoreOwnership) -> None:
        self._host = host
        self.ownership = ownership
        # A sweep's renewals are with the committer (its answer not back yet).
        self._renewing = False

    # -- takeover ----------------------------------------------------------------------

    def adopt(self, message: Adopt) -> None:
        """Take a session over from the store for a resume that proves its token
        (`StoreOwnership.take_over`). The session arrives parked; the resume
        wakes it."""
        call, session_id, host = message.call, message.session_id, self._host
        routed = host.routes.get(session_id) is not None
        decision = host.machine.adopt(session_id, call, routed=routed)
        if isinstance(decision, WaitForTakeover):  # its takeover is with the store
            return
        if isinstance(decision, TakeOver):
            command = call.command
            assert isinstance(command, Resume | AuthenticateResume)  # noqa: S101
            token = command.resume_token
            if decision.off_loop:  # the answer comes back as Adopted

                def answer(outcome: object, error: BaseException | None) -> None:
                    host.tell_supervisor(
                        Adopted(session_id=session_id, outcome=outcome, error=error)
                    )

                self.ownership.take_over_later(session_id, token, answer)
                return
            try:
                outcome = self.ownership.take_over(session_id, token)
            except StoreError as exc:
                call.reply.fail(exc)
                return
            if not self._take_in(session_id, call, outcome):
                return
        self._route_adopted(session_id, call)

    def adopted(self, message: Adopted) -> None:
        """The store answered a takeover: route its first call, then the others."""
        session_id, host = message.session_id, self._host
        calls = host.machine.takeover_answered(session_id)
        if not calls:
            return
        first = calls[0]
        if message.error is not None:
            first.reply.fail(message.error)
        elif (
            host.machine.stopping
            or host.routes.get(session_id) is not None
            or self._take_in(session_id, first, cast(Takeover, message.outcome))
        ):
            self._route_adopted(session_id, first)
        for call in calls[1:]:  # each proves its own token (or finds it routed now)
            self.adopt(Adopt(session_id=session_id, call=call))

    def _take_in(self, session_id: str, call: Call, outcome: Takeover) -> bool:
        """Route a session taken over from the store (``True``), or answer
        ``call`` why not: not stored, or its token proved nothing."""
        stored, taken = outcome
        if stored is None:
            answer_unknown(call.reply, call.command, session_id)
            return False
        if taken is None:
            call.reply.fail(InvalidResumeTokenError("invalid duplex resume token"))
            return False
        host = self._host
        parked = parked_from_store(taken, self.ownership.wall_offset())
        routed = SessionMailbox(session_id, host)
        routed.adopt(parked, taken.epoch)
        host.routes[session_id] = routed
        host.books.adopted(parked)
        host.file_parked(routed, parked)
        host.notify(LifecycleEvent.about("taken_over", parked, "store"))
        return True

    def _route_adopted(self, session_id: str, call: Call) -> None:
        routed = self._host.routes.get(session_id)
        if routed is None:
            answer_unknown(call.reply, call.command, session_id)
            return
        try:
            routed.tell(call)
        except InboxClosedError:
            answer_unknown(call.reply, call.command, session_id)

    # -- every lease this process holds ------------------------------------------------

    def renew(self) -> None:
        """Renew this process's leases (a sweep's); a refused one was taken over elsewhere."""
        host = self._host
        held = tuple((m, m.store_epoch) for m in list(host.routes.values()) if m.store_epoch)
        leases = [(m.session_id, epoch) for m, epoch in held]
        if self.ownership.committer is None:
            renewed = self.ownership.renew(leases)
            if renewed is not None:  # else the store is away: the next sweep tries again
                self.renewed(LeasesRenewed(held=held, renewed=renewed))
            return
        if self._renewing or not held:
            return  # the last sweep's renewals are still on their way
        self._renewing = True

        def answer(renewed: Renewals | None) -> None:
            host.tell_supervisor(LeasesRenewed(held=held, renewed=renewed))

        self.ownership.renew_later(leases, answer)

    def renewed(self, message: LeasesRenewed) -> None:
        """The store answered a sweep's renewals: let go of what another process took."""
        self._renewing = False
        if message.renewed is None:
            return  # the store is away: the next sweep tries again
        host = self._host
        for (mailbox, epoch), kept in zip(message.held, message.renewed, strict=True):
            # Only a refusal lets go; an unavailable answer (that session's
            # part of the store is away) keeps it, to be renewed next sweep.
            if kept is not False or host.routes.get(mailbox.session_id) is not mailbox:
                continue
            parked = mailbox.parked
            if parked is not None and mailbox.close_if_parked():
                host.unroute(mailbox)
                host.books.parked_left(parked, reason="replaced")
                # As a live session's refused write does: the gateway frees its place.
                host.notify(LifecycleEvent.about("replaced", parked, "store"))
            else:
                mailbox.tell_if_live(Replaced(epoch=epoch))

    def forget(self, mailbox: SessionMailbox) -> None:
        """An expired parked session leaves the store too (if still ours)."""
        epoch = mailbox.store_epoch
        if epoch is not None:
            self.ownership.delete(mailbox.session_id, epoch)
