"""duplex-supervisor: resumable duplex sessions as actors, behind three front doors.

Everything a user needs is importable from here; the modules of this
package are internal and may change (the seed drop-in,
`supervisor.compat`, the pytest plugin, `supervisor.testing`, and
the gateway, `supervisor.gateway`, are public modules of their own).

* trio: ``async with supervisor.open_session_registry(...) as registry``
* asyncio: ``async with supervisor.open_asyncio_registry(...) as registry``
* threads: ``with supervisor.ThreadSessionRegistry(...) as registry``

Every door takes the keyword arguments of `RegistryOptions` (typed as
`RegistryOptionsDict`, so a type checker refuses a misspelled one) and has
every method of the seed's registry, with the same names, parameters,
results and errors.
"""

from __future__ import annotations

import logging

from actors._commands import (
    DetachedAttachment,
    LifecycleEvent,
    ResumeResult,
    SessionCreated,
    TransportAttachment,
)
from actors._credential import ResumeToken
from actors._errors import (
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
    SessionReplacedError,
    StoreError,
    StoreOutcomeUnknownError,
    StoreUnavailableError,
    TokenConflictError,
    UnknownSessionError,
)
from actors._journal import JournalEntry
from actors._store import SessionStore
from supervisor._faults import FaultPlan, InjectedFaultError
from supervisor._options import RegistryOptions, RegistryOptionsDict
from supervisor._policy import RestartPolicy
from supervisor._system import RegistryStats
from supervisor.doors._asyncio import AsyncioSessionRegistry
from supervisor.doors._asyncio import open_session_registry as open_asyncio_registry
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.doors._threads import BlockingClose, BlockingSend, ThreadSessionRegistry
from supervisor.doors._trio import TrioSessionRegistry, open_session_registry
from supervisor.stores._memory import MemoryStore

logging.getLogger("duplex_supervisor.supervisor").addHandler(logging.NullHandler())

__all__ = [
    "ActivationAbortedError",
    "AsyncSessionRegistry",
    "AsyncioSessionRegistry",
    "BlockingClose",
    "BlockingSend",
    "DetachedAttachment",
    "DuplicateSessionError",
    "FaultPlan",
    "InjectedFaultError",
    "InvalidInputError",
    "InvalidPayloadError",
    "InvalidResumeTokenError",
    "InvalidSequenceError",
    "InvalidSessionIdError",
    "JournalEntry",
    "JournalGapError",
    "JournalOverflowError",
    "LifecycleEvent",
    "MemoryStore",
    "RegistryClosedError",
    "RegistryOptions",
    "RegistryOptionsDict",
    "RegistryStats",
    "RestartPolicy",
    "ResumeResult",
    "ResumeToken",
    "SendTimeoutError",
    "SessionCrashedError",
    "SessionCreated",
    "SessionError",
    "SessionFailedError",
    "SessionReplacedError",
    "SessionStore",
    "StoreError",
    "StoreOutcomeUnknownError",
    "StoreUnavailableError",
    "ThreadSessionRegistry",
    "TokenConflictError",
    "TransportAttachment",
    "TrioSessionRegistry",
    "UnknownSessionError",
    "open_asyncio_registry",
    "open_session_registry",
]
