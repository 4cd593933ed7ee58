"""`Throttles`: failed resumes counted per client address and per session, wrong
credentials per address, without I/O; the admission
(`supervisor.gateway._admission`) asks it once a credential was wrong."""

from __future__ import annotations

from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._limits import FailureThrottle
from supervisor.gateway._protocol import ProtocolError

__all__ = ["Throttles"]


class Throttles:
    """Failed resumes (per client address and per session) and wrong secrets or
    refused identities (per client address). Only a failure is ever refused:
    callers verify the credential first and come here once it was wrong, so
    the right token or secret is never answered throttled. Each failure
    counts; the answer is the failure's own error until its key is blocked."""

    def __init__(self, config: GatewayConfig) -> None:
        keys = config.throttle_max_addresses
        self._resumes = FailureThrottle(
            config.resume_failures_allowed, config.resume_failure_window_s, keys
        )
        self._sessions = FailureThrottle(
            config.session_resume_failures_allowed, config.session_resume_failure_window_s, keys
        )
        self._secrets = FailureThrottle(
            config.secret_failures_allowed, config.secret_failure_window_s, keys
        )

    def __len__(self) -> int:
        """Keys (addresses, sessions) held now: bounded and expiring."""
        return len(self._resumes) + len(self._sessions) + len(self._secrets)

    def failed_resume(
        self, address: str, session_id: str, error: ProtocolError, now: float
    ) -> ProtocolError:
        blocked = self._resumes.blocked(address, now) or self._sessions.blocked(session_id, now)
        self._resumes.failed(address, now)
        self._sessions.failed(session_id, now)
        if blocked:
            return ProtocolError("resume_throttled", "too many failed resumes; wait and retry")
        return error

    def failed_credential(self, address: str, message: str, now: float) -> ProtocolError:
        blocked = self._secrets.blocked(address, now)
        self._secrets.failed(address, now)
        if blocked:
            return ProtocolError("secret_throttled", "too many wrong secrets from this address")
        return ProtocolError("unauthorized", message)
