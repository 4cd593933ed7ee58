"""The supervisor half of duplex-supervisor: routing, restarts and front doors.

Errors are importable from here as well as from :mod:`actors`.
"""

from __future__ import annotations

import logging

from actors.errors import (
    ActivationAbortedError,
    DuplicateSessionError,
    InvalidInputError,
    InvalidPayloadError,
    InvalidResumeTokenError,
    InvalidSequenceError,
    InvalidSessionIdError,
    JournalGapError,
    JournalOverflowError,
    RegistryClosedError,
    SendTimeoutError,
    SessionCrashedError,
    SessionError,
    SessionFailedError,
    UnknownSessionError,
)

logger = logging.getLogger("duplex_supervisor.supervisor")
logger.addHandler(logging.NullHandler())

__all__ = [
    "ActivationAbortedError",
    "DuplicateSessionError",
    "InvalidInputError",
    "InvalidPayloadError",
    "InvalidResumeTokenError",
    "InvalidSequenceError",
    "InvalidSessionIdError",
    "JournalGapError",
    "JournalOverflowError",
    "RegistryClosedError",
    "SendTimeoutError",
    "SessionCrashedError",
    "SessionError",
    "SessionFailedError",
    "UnknownSessionError",
    "logger",
]
