"""The session half of duplex-supervisor: a pure state machine and its actor.

``actors`` never imports ``supervisor``. Its modules :mod:`~actors.journal`,
:mod:`~actors.credential`, :mod:`~actors.state`, :mod:`~actors.messages` and
:mod:`~actors.codec` import no pykka, trio, asyncio or threading.
"""

from __future__ import annotations

import logging

from actors.codec import CodecError, from_dict, to_dict
from actors.credential import ResumeCredential, ResumeToken
from actors.errors import (
    ActivationAbortedError,
    DuplicateSessionError,
    GapReason,
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
from actors.journal import EventJournal, JournalEntry
from actors.messages import (
    DetachedAttachment,
    LifecycleEvent,
    ResumeResult,
    SessionCreated,
    TransportAttachment,
)
from actors.state import FAILPOINTS, Failpoints, SessionConfig, SessionState, Transition

logger = logging.getLogger("duplex_supervisor.actors")
logger.addHandler(logging.NullHandler())

__all__ = [
    "FAILPOINTS",
    "ActivationAbortedError",
    "CodecError",
    "DetachedAttachment",
    "DuplicateSessionError",
    "EventJournal",
    "Failpoints",
    "GapReason",
    "InvalidInputError",
    "InvalidPayloadError",
    "InvalidResumeTokenError",
    "InvalidSequenceError",
    "InvalidSessionIdError",
    "JournalEntry",
    "JournalGapError",
    "JournalOverflowError",
    "LifecycleEvent",
    "RegistryClosedError",
    "ResumeCredential",
    "ResumeResult",
    "ResumeToken",
    "SendTimeoutError",
    "SessionConfig",
    "SessionCrashedError",
    "SessionCreated",
    "SessionError",
    "SessionFailedError",
    "SessionState",
    "Transition",
    "TransportAttachment",
    "UnknownSessionError",
    "from_dict",
    "logger",
    "to_dict",
]
