"""The supervisor carrying out its decisions on crashes, and the registry's health.

`SupervisorMachine` (`actors._supervisor_machine`) decides, with plain calls;
`Restarts` carries each decision out, in the supervisor's turns: restart a
suspended session now (`Restart`) or when a backoff timer of its own fires
(`Proceed`), fail it (`FailSession`), close a parked session whose wake-up
crashed, and report the registry unhealthy (or healthy again) to the
observer.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Protocol

from actors._commands import LifecycleEvent
from actors._errors import RegistryClosedError, SessionFailedError
from actors._held import answer_held
from actors._mailbox import InboxClosedError, SessionMailbox
from actors._supervisor_machine import (
    CloseParked,
    Escalate,
    FailSuspended,
    Recover,
    RestartAfter,
    RestartNow,
    SupervisorMachine,
)
from actors._supervisor_mail import Call, FailSession, Restart
from supervisor._system_books import Books, Crashed, Proceed, Timers, Wake

__all__ = ["Restarts", "RestartsHost", "answer_closed"]


def answer_closed(mailbox: SessionMailbox, *, failed: bool = False) -> None:
    """Close a mailbox nobody runs; answer what it held (closed, or failed)."""
    error: Exception = (
        SessionFailedError(f"session {mailbox.session_id} failed and was closed")
        if failed
        else RegistryClosedError("the session registry was shut down")
    )
    answer_held(mailbox.close(), mailbox.session_id, error)


class RestartsHost(Protocol):
    """The supervisor as `Restarts` sees it (`supervisor._system.SessionSystem`)."""

    machine: SupervisorMachine[Call]
    books: Books
    timers: Timers
    clock: Callable[[], float]

    def activate(self, message: Wake) -> None:
        """Start an actor for a parked session."""

    def unroute(self, mailbox: SessionMailbox) -> None: ...

    def notify(self, event: LifecycleEvent) -> None: ...


class Restarts:
    """Carries out the machine's crash and health decisions for one registry."""

    def __init__(self, host: RestartsHost) -> None:
        self._host = host

    def decide(self, message: Crashed) -> None:
        """Carry out the machine's decisions on one crash (see SupervisorMachine.crashed)."""
        report, host = message.report, self._host
        if report.during == "reactivate":
            # That actor has stopped: keep its counts, drop it from the live ones.
            host.books.reactivation_crashed(report.mailbox)
            host.books.retire(report.actor_urn, "reactivate_crashed")
        for decision in host.machine.crashed(report):
            if isinstance(decision, Escalate | Recover):
                self._health_changed(decision)
            elif isinstance(decision, RestartAfter):
                host.timers.schedule(host.clock() + decision.delay_s, Proceed(report=report))
            elif isinstance(decision, RestartNow):
                self.proceed(Proceed(report=report))
            elif isinstance(decision, FailSuspended):
                with contextlib.suppress(InboxClosedError):
                    report.mailbox.tell(FailSession())
            elif isinstance(decision, CloseParked):
                self._close_failed(report.mailbox)

    def proceed(self, message: Proceed) -> None:
        """Restart now (a backoff ran out, or none was needed)."""
        report = message.report
        if report.during == "reactivate":
            self._host.activate(Wake(mailbox=report.mailbox))
            return
        with contextlib.suppress(InboxClosedError):
            report.mailbox.tell(Restart())

    def _close_failed(self, mailbox: SessionMailbox) -> None:
        """Close a session given up on while parked (its wake-up crashed)."""
        parked = mailbox.take_parked()
        if parked is None:
            return
        host = self._host
        host.books.parked_left(parked, reason="failed")
        host.unroute(mailbox)
        host.notify(LifecycleEvent.about("failed", parked, "session_failed"))
        answer_closed(mailbox, failed=True)

    def judge_health(self, now: float) -> None:
        """A sweep: the registry is healthy again once its crashes left the window."""
        for decision in self._host.machine.swept(now):
            self._health_changed(decision)

    def _health_changed(self, decision: Escalate | Recover) -> None:
        escalated = isinstance(decision, Escalate)
        if escalated:
            self._host.books.escalated()
        self._host.notify(
            LifecycleEvent(
                kind="registry_unhealthy" if escalated else "registry_healthy",
                session_id="",
                reason=f"{decision.crashes} crashes within {decision.within_s:g} s",
            )
        )
