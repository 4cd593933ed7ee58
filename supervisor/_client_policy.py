"""The client's settings, counters and errors (`supervisor.client` exports the
public ones): the reconnect policy, the fatal close codes, what the client
keeps per client event."""

from __future__ import annotations

import random
import ssl as _ssl
from dataclasses import dataclass, field

from actors._errors import SessionError

__all__ = [
    "ACKED_WINDOW",
    "FATAL_CLOSE_CODES",
    "FATAL_ERRORS",
    "ClientError",
    "FatalCloseError",
    "Options",
    "Pending",
    "ReconnectGaveUpError",
    "ReconnectPolicy",
    "Statistics",
]

FATAL_CLOSE_CODES: dict[int, str] = {
    4000: "replaced",
    4400: "bad_request",
    4401: "unauthorized",
    4403: "invalid_resume_token",
    4404: "unknown_session",
    4410: "journal_gap",
    4413: "overflow",
    4500: "session_failed",
}
"""Close codes after which resuming cannot help: `FatalCloseError`, no retry.
(4000: another client resumed the session; 4400: this client broke the protocol.)"""

#: How many acked client events the client keeps besides the unacked ones (and
#: besides those from the oldest input not yet answered on).
ACKED_WINDOW = 1024

#: Error codes the server sends before closing with one of those codes.
FATAL_ERRORS = {name: code for code, name in FATAL_CLOSE_CODES.items()}


class ClientError(SessionError):
    """Base of the client's errors (a `supervisor.SessionError`)."""


class FatalCloseError(ClientError):
    """The server ended the session for good: ``code`` (e.g. 4404) and ``reason``."""

    def __init__(self, code: int, reason: str, message: str = "") -> None:
        text = f"the server ended the session: {code} {reason}"
        super().__init__(f"{text} ({message})" if message else text)
        self.code = code
        self.reason = reason


class ReconnectGaveUpError(ClientError):
    """No connection could be resumed before `ReconnectPolicy.give_up_after_s`."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ReconnectPolicy:
    """Exponential backoff with jitter: attempt ``n`` (from 0) waits a random
    time between ``(1 - jitter)`` and 1 times ``min(max_delay_s, initial_delay_s
    * multiplier ** n)``; the client gives up once ``give_up_after_s`` passed
    since the connection was lost (`ReconnectGaveUpError`)."""

    initial_delay_s: float = 0.05
    max_delay_s: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.5
    give_up_after_s: float = 60.0

    def __post_init__(self) -> None:
        if not (0 <= self.initial_delay_s <= self.max_delay_s) or self.multiplier < 1:
            raise ValueError("need 0 <= initial_delay_s <= max_delay_s and multiplier >= 1")
        if not 0 <= self.jitter <= 1 or self.give_up_after_s < 0:
            raise ValueError("need 0 <= jitter <= 1 and give_up_after_s >= 0")

    def delay(self, attempt: int, rng: random.Random) -> float:
        """How long attempt ``attempt`` waits."""
        ceiling = min(self.max_delay_s, self.initial_delay_s * self.multiplier**attempt)
        return ceiling * rng.uniform(1 - self.jitter, 1)


@dataclass(slots=True)
class Pending:
    client_seq: int
    message: str | bytes
    #: An input's id (its answer is a ``response.done`` naming it).
    input_id: str | None = None


@dataclass(slots=True)
class Statistics:
    events: int = 0
    resumes: int = 0
    replayed: int = 0
    duplicates_dropped: int = 0
    reconnect_attempts: int = 0
    disconnects: int = 0
    client_events_sent: int = 0
    client_events_acked: int = 0
    client_events_resent: int = 0
    inputs_sent: int = 0
    inputs_answered: int = 0
    errors: int = 0


@dataclass(slots=True)
class Options:
    url: str
    secret: str | None = field(repr=False)
    ssl: _ssl.SSLContext | None
    policy: ReconnectPolicy
    ack_every: int
    ack_interval_s: float
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    connect_timeout_s: float
    max_inputs_in_flight: int
    buffer: int
    rng: random.Random
