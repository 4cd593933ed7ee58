"""What one session actor counts for ``stats()``: written by its thread, read by anyone.

Pure: no I/O, no threads, no event loop. Each field is a plain int (or
bool) that only the owning actor's thread writes, so a reader on another
thread sees some recent value of each, never a torn one.
"""

from __future__ import annotations

from actors._commands import ActivationOutcome, Command, ResumeResult
from actors._errors import InvalidResumeTokenError, JournalGapError, JournalOverflowError
from actors._journal import JournalEntry
from actors._transition import Transition

__all__ = ["SUMMED", "SessionCounters"]

#: The counters a registry sums over its sessions, live, parked or gone.
SUMMED: tuple[str, ...] = (
    "events_journaled",
    "resumes",
    "resumes_with_replay",
    "rollbacks",
    "crashes",
    "restarts",
    "gap_errors",
    "overflow_errors",
    "invalid_tokens",
)


class SessionCounters:
    """One actor's figures; see the module docstring for who writes them."""

    __slots__ = (
        "attached",
        "bytes_retained",
        "crashes",
        "events_journaled",
        "gap_errors",
        "invalid_tokens",
        "overflow_errors",
        "restarts",
        "resumes",
        "resumes_with_replay",
        "rollbacks",
    )

    def __init__(self, *, attached: bool = True, bytes_retained: int = 0) -> None:
        self.attached = attached
        self.bytes_retained = bytes_retained
        self.crashes = 0
        self.events_journaled = 0
        self.gap_errors = 0
        self.invalid_tokens = 0
        self.overflow_errors = 0
        self.restarts = 0
        self.resumes = 0
        self.resumes_with_replay = 0
        self.rollbacks = 0

    def count(self, command: Command, transition: Transition) -> None:
        """Count what one committed transition (or its domain error) did."""
        error = transition.error
        if error is not None:
            if isinstance(error, InvalidResumeTokenError):
                self.invalid_tokens += 1
            elif isinstance(error, JournalGapError):
                self.gap_errors += 1
            elif isinstance(error, JournalOverflowError):
                self.overflow_errors += 1
            return
        reply = transition.reply
        if type(reply) is JournalEntry:  # one event, the commonest: no chain below
            self.events_journaled += 1
            return
        if isinstance(reply, ResumeResult):
            self.resumes += 1
            self.resumes_with_replay += bool(reply.replay_entries)
        elif isinstance(command, ActivationOutcome):
            self.rollbacks += reply is True
        elif isinstance(reply, tuple):
            # A batch; a coalesced one may hold the errors refusing some.
            for item in reply:
                self.events_journaled += isinstance(item, JournalEntry)
                self.overflow_errors += isinstance(item, JournalOverflowError)
        elif isinstance(reply, JournalEntry):
            self.events_journaled += 1
