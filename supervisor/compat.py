"""A drop-in for the seed module: change the import line, keep the program.

    # from session_attachment import DuplexSessionAttachmentRegistry
    from supervisor.compat import DuplexSessionAttachmentRegistry

Every public name of the seed is here, each our class (or an alias of it),
and `DuplexSessionAttachmentRegistry` takes the seed's constructor
and behaves as the seed did: lenient input, no send timeout, no transport
closed by the library. It needs no start or stop: the actors start on the
first call, inside the running asyncio loop, on daemon threads, and a
finalizer stops them, so a program that never closes it still exits. Call
`DuplexSessionAttachmentRegistry.aclose` to stop it early. It is bound
to the loop of its first call; using it from another loop is an error.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable

from actors._commands import (
    DetachedAttachment,
    ResumeResult,
    SessionCreated,
    TransportAttachment,
)
from actors._credential import ResumeCredential, ResumeToken
from actors._errors import InvalidResumeTokenError, JournalGapError, JournalOverflowError
from actors._journal import EventJournal, JournalEntry
from actors._ports import NO_WAITER
from supervisor._system import RegistryStats, SessionSystem
from supervisor.doors._asyncio import AsyncioSessionRegistry

__all__ = [
    "DuplexDetachedAttachment",
    "DuplexEventJournal",
    "DuplexJournalGapError",
    "DuplexJournalOverflowError",
    "DuplexResumeCredential",
    "DuplexSessionAttachmentCreated",
    "DuplexSessionAttachmentRegistry",
    "DuplexSessionResumeResult",
    "DuplexTransportAttachment",
    "InvalidResumeTokenError",
    "JournalEntry",
    "ResumeToken",
]

DuplexEventJournal = EventJournal
DuplexJournalGapError = JournalGapError
DuplexJournalOverflowError = JournalOverflowError
DuplexResumeCredential = ResumeCredential
DuplexSessionAttachmentCreated = SessionCreated
DuplexDetachedAttachment = DetachedAttachment
DuplexSessionResumeResult = ResumeResult
DuplexTransportAttachment = TransportAttachment


def _stop_quietly(system: SessionSystem) -> None:
    """The finalizer: tell every actor to stop, waiting for nothing.

    A finalizer may run on any thread; the actors run on the registry's loop
    (no thread of theirs keeps the interpreter alive), so a stop is only a
    message, dropped if that loop has ended.
    """
    system.shutdown(NO_WAITER)


class DuplexSessionAttachmentRegistry(AsyncioSessionRegistry):
    """The seed's registry, method by method, run by session actors.

    Every method is the asyncio door's; this class only binds lazily. Each
    of them checks that the registry is open before anything else, which is
    where the binding happens, in the running loop of the first call.
    """

    def __init__(
        self,
        *,
        replay_ttl_s: float,
        replay_max_bytes_per_session: int,
        clock: Callable[[], float] | None = None,
    ) -> None:
        # The seed's checks and messages, before any loop exists.
        if replay_ttl_s <= 0:
            raise ValueError("replay_ttl_s must be positive")
        if replay_max_bytes_per_session <= 0:
            raise ValueError("replay_max_bytes_per_session must be positive")
        self._seed_options = (replay_ttl_s, replay_max_bytes_per_session, clock)
        self._strict = False
        self._closed = False
        self._bound = False

    def __repr__(self) -> str:
        return f"{type(self).__name__}(session_ids={sorted(self.session_ids())})"

    def _check_open(self) -> None:
        loop = asyncio.get_running_loop()
        if not self._bound:
            ttl, max_bytes, clock = self._seed_options
            AsyncioSessionRegistry.__init__(
                self,
                replay_ttl_s=ttl,
                replay_max_bytes_per_session=max_bytes,
                clock=clock,
                send_timeout_s=None,
                strict=False,
            )
            self._bound = True
            weakref.finalize(self, _stop_quietly, self._system)
        elif self._loop is not loop:
            raise RuntimeError(
                "this DuplexSessionAttachmentRegistry is bound to the event loop of its first "
                "call; make one per loop"
            )
        super()._check_open()

    def session_ids(self) -> list[str]:
        """The registered session ids, parked ones included (none before the first call)."""
        return super().session_ids() if self._bound else []

    def stats(self) -> RegistryStats:
        """The registry's figures (all zero before the first call)."""
        return super().stats() if self._bound else RegistryStats()

    async def aclose(self) -> None:
        """Stop the actors now (optional: a finalizer does it otherwise)."""
        if self._bound:
            await super().aclose()
        self._closed = True
