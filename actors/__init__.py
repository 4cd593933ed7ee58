"""The session half of duplex-supervisor: a pure state machine and its actor.

What a user needs from this package is re-exported here (and, but for the
pure core, from `supervisor` too): the error tree, the seed's journal
and credential, the results of the registry's methods and the observer's
events. Everything else in its modules (the sans-I/O state machine
included, for now) is internal and may change.

``actors`` never imports ``supervisor``. The machine's modules (``_journal``,
``_credential``, ``_state`` and its rules, ``_transition``, ``_commands``,
``_lifecycle``, ``_counters``, ``_fields``, ``_errors``, ``_store``,
``_client_seqs``, ``_supervisor_machine``) and ``_ownership`` import no
pykka, trio, asyncio or threading, not even through each other.
"""

from __future__ import annotations

import logging

from actors._commands import (
    ActivationPayloadFactory,
    CloseCallable,
    DetachedAttachment,
    LifecycleEvent,
    LifecycleKind,
    ReplayCountingFactory,
    ResumeResult,
    SendCallable,
    SessionCreated,
    TransportAttachment,
)
from actors._credential import ResumeCredential, ResumeToken
from actors._errors import (
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
    SessionReplacedError,
    StoreError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
    TokenConflictError,
    UnknownSessionError,
)
from actors._journal import EventJournal, JournalEntry
from actors._store import SessionRecord, SessionStore, StoredEvent, StoredSession

logging.getLogger("duplex_supervisor.actors").addHandler(logging.NullHandler())


__all__ = [
    "ActivationAbortedError",
    "ActivationPayloadFactory",
    "CloseCallable",
    "DetachedAttachment",
    "DuplicateSessionError",
    "EventJournal",
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
    "LifecycleKind",
    "RegistryClosedError",
    "ReplayCountingFactory",
    "ResumeCredential",
    "ResumeResult",
    "ResumeToken",
    "SendCallable",
    "SendTimeoutError",
    "SessionCrashedError",
    "SessionCreated",
    "SessionError",
    "SessionFailedError",
    "SessionRecord",
    "SessionReplacedError",
    "SessionStore",
    "StoreError",
    "StoreOutcomeUnknownError",
    "StoreUnavailableError",
    "StoredEvent",
    "StoredSession",
    "TokenConflictError",
    "TransportAttachment",
    "UnknownSessionError",
]
