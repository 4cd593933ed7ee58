"""Where a session's committed effects go: its attachments' outboxes, the loop, the observer.

The session actor hands every committed transition here (`SessionEffects.release`):
frames go to the outbox of the attachment generation they are for, in order;
``on_accepted`` callbacks to the registry's loop; lifecycle events to the
observer; and the reply goes to the caller, at once or (for frames the caller
waits on, an activation) by the outbox once the frames are sent. Nothing here
does I/O: an outbox sends on its own loop (one whose transport has
``send_now`` writes a lone frame in this call, never waiting).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from actors._commands import (
    Activate,
    ActivationOutcome,
    Deliver,
    EventAccepted,
    LifecycleEvent,
    Notify,
    ResumeResult,
    RetireAttachment,
)
from actors._mailbox import InboxClosedError, SessionMailbox
from actors._ports import Delivery, LoopPort, Outbox, Reply
from actors._supervisor_mail import NO_REPLY, Call
from actors._transition import Transition

__all__ = ["SessionEffects"]

# A tuple, not ``A | B``: a union is a new object per isinstance call, and
# this runs per effect.
_DELIVERIES = (Deliver, Activate)


class SessionEffects:
    """One session's outboxes, by attachment generation, and the release of its effects.

    Invariant: the keys are attachment generations the state may still
    deliver to; the current attachment's outbox is always here.
    """

    __slots__ = ("_mailbox", "_notify", "_outboxes", "_port")

    def __init__(
        self,
        *,
        mailbox: SessionMailbox,
        port: LoopPort,
        notify: Callable[[LifecycleEvent], None],
        first: Outbox | None,
    ) -> None:
        self._mailbox = mailbox
        self._port = port
        self._notify = notify
        self._outboxes: dict[int, Outbox] = {1: first} if first is not None else {}

    def release(
        self, transition: Transition, reply: Reply, new_outbox: Outbox | None = None
    ) -> None:
        """Carry out a committed transition's effects, then answer the caller."""
        if transition.error is not None:
            reply.fail(transition.error)
            return
        if new_outbox is not None and isinstance(transition.reply, ResumeResult):
            self._outboxes[transition.reply.attachment_generation] = new_outbox
        answered = False
        for effect in transition.effects:
            # Distinct types, so the order only saves checks: frames first.
            if isinstance(effect, _DELIVERIES):
                answered |= self._post(effect, reply, transition.reply)
            elif isinstance(effect, EventAccepted):
                self._port.submit(effect.callback)
            elif isinstance(effect, RetireAttachment):
                outbox = self._outboxes.pop(effect.attachment_generation, None)
                if outbox is not None:
                    outbox.retire(effect.reason)
            elif isinstance(effect, Notify):
                self._notify(effect.event)
        if not answered:
            reply.resolve(transition.reply)

    def _post(self, effect: Deliver | Activate, reply: Reply, value: object) -> bool:
        """Queue ``effect`` on its outbox; whether the outbox answers ``reply``."""
        outbox = self._outboxes.get(effect.attachment_generation)
        if outbox is None:
            return False
        if isinstance(effect, Activate):
            outbox.post(Delivery(effect=effect, reply=reply, value=value, report=self._report))
            return True
        if effect.awaited:
            outbox.post(Delivery(effect=effect, reply=reply, value=value))
            return True
        outbox.post(Delivery(effect=effect))
        return False

    def _report(self, outcome: ActivationOutcome) -> None:
        """Called on the outbox's loop: hand the outcome back as a message."""
        # A session already gone has nothing left to roll back.
        with contextlib.suppress(InboxClosedError):
            self._mailbox.tell(Call(command=outcome, reply=NO_REPLY, internal=True))

    def close_transport(self, attachment_generation: int, reason: str) -> None:
        """Close that attachment's transport with ``reason`` (its outbox, if any)."""
        outbox = self._outboxes.pop(attachment_generation, None)
        if outbox is not None:
            outbox.close_transport(reason)

    def retire_all(self, reason: str) -> None:
        """The session leaves (or parks): every outbox is retired with ``reason``."""
        for outbox in self._outboxes.values():
            outbox.retire(reason)
        self._outboxes.clear()
