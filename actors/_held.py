"""What a session actor holds while it may not run its messages.

Two things stop a session from running the next message: a crash (it is
*suspended* until its supervisor answers `Restart` or `FailSession`) and a
write in flight (`actors._store_link`: nothing is released before the store
answered). Meanwhile every later message is held here in arrival order, and
run in that order once the session may go on. An internal command that
crashed is kept apart, to be run again first on `Restart` (once: a second
crash of it fails the session).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable

from actors._errors import SessionCrashedError
from actors._supervisor_mail import Call, Mail, Shutdown, answer_unknown, carried_call

__all__ = ["HeldMail", "answer_held", "crash_error"]


def answer_held(held: Iterable[object], session_id: str, failure: BaseException | None) -> None:
    """Answer what a session leaves behind as it goes: each call ``failure``
    (``None``: the seed's unknown-session answer), each shutdown its done."""
    for mail in held:
        call = carried_call(mail)  # a call, or a parking proposal's tick
        if call is not None:
            if failure is not None:
                call.reply.fail(failure)
            else:
                answer_unknown(call.reply, call.command, session_id)
        elif isinstance(mail, Shutdown) and mail.reply is not None:
            mail.reply.resolve(None)


def crash_error(session_id: str, call: Call, exc: BaseException) -> SessionCrashedError:
    """What the caller of ``call`` hears of a crash handling it (``exc`` its cause)."""
    name = type(call.command).__name__
    error = SessionCrashedError(f"session {session_id} crashed handling {name}")
    error.__cause__ = exc
    return error


class HeldMail:
    """One session actor's held messages, its suspension and its retry (see the module)."""

    __slots__ = ("_held", "retry", "suspended")

    def __init__(self) -> None:
        # Made on the first message held: most sessions never need its ~600 bytes.
        self._held: deque[Mail] | None = None
        #: Crashed: held until the supervisor decides.
        self.suspended = False
        #: An internal command that crashed once: run again first on Restart.
        self.retry: Call | None = None

    def __len__(self) -> int:
        """How many messages are held (not the retry)."""
        return 0 if self._held is None else len(self._held)

    def hold(self, message: Mail) -> None:
        if self._held is None:
            self._held = deque()
        self._held.append(message)

    def suspend(self, session_id: str, call: Call, exc: BaseException, *, retry: bool) -> None:
        """A handler crashed on ``call``: answer its caller (or keep it to retry),
        and hold everything until the supervisor decides."""
        # A command retried after this crash answers its waiter with the
        # retry's outcome, not with this crash.
        if call.internal and retry:
            self.retry = call
        else:
            call.reply.fail(crash_error(session_id, call, exc))
        self.suspended = True

    def release(self, ready: Callable[[], bool], receive: Callable[[Mail], object]) -> None:
        """Hand the held messages to ``receive``, in order, while ``ready()``."""
        held = self._held
        while held and ready():
            receive(held.popleft())

    def drain(self) -> list[Mail]:
        """The held messages (not the retry), in order; none are held after."""
        held = self._held
        if not held:
            return []
        drained = list(held)
        held.clear()
        return drained
