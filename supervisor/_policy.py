"""How often a session may crash before its supervisor gives up on it."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RestartPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartPolicy:
    """What the supervisor decides when a session crashes (OTP's restart intensity).

    More than ``max_restarts`` crashes of one session within ``within_s``
    seconds (of the registry's clock, each crash at the time it happened, not
    when the supervisor read its report) and the supervisor closes the session
    (``close("session_failed")``) instead of restarting it.

    ``backoff_s`` delays each restart by ``backoff_s * 2**(n-1)`` (n: crashes
    in the window), spread by ``jitter`` (a fraction, 0 to 1), capped at
    ``max_backoff_s``. The delay is a timer of the supervisor's (on the
    registry's clock); the crashed session holds its messages meanwhile and
    its thread does not sleep.

    ``registry_max_restarts`` is OTP's escalation: more than that many crashes
    across the whole registry within ``within_s`` and the registry is
    *unhealthy* (``stats().healthy`` is False, the observer hears
    ``registry_unhealthy``): while it is, a crashing session is closed instead
    of restarted. It is healthy again (``registry_healthy``) once the crashes
    in the window fall back to the limit. ``None`` (the default): no limit.
    """

    max_restarts: int = 3
    within_s: float = 60.0
    backoff_s: float = 0.0
    max_backoff_s: float = 5.0
    jitter: float = 0.1
    registry_max_restarts: int | None = None

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if not self.within_s > 0:
            raise ValueError("within_s must be positive")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("backoff must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")
        if self.registry_max_restarts is not None and self.registry_max_restarts < 0:
            raise ValueError("registry_max_restarts must be None or >= 0")

    def allows_restart(self, crash_times: list[float], now: float) -> bool:
        """``crash_times`` includes the crash at ``now``; stale ones are dropped in place."""
        self.forget_stale(crash_times, now)
        return len(crash_times) <= self.max_restarts

    def registry_healthy(self, crash_times: list[float], now: float) -> bool:
        """Escalation: ``crash_times`` are the whole registry's (stale ones dropped)."""
        self.forget_stale(crash_times, now)
        limit = self.registry_max_restarts
        return limit is None or len(crash_times) <= limit

    def forget_stale(self, crash_times: list[float], now: float) -> None:
        """Drop, in place, the crash times that left the window at ``now``."""
        cutoff = now - self.within_s
        if crash_times and crash_times[0] <= cutoff:
            crash_times[:] = [t for t in crash_times if t > cutoff]

    def backoff_s_for(self, restarts: int) -> float:
        """The delay before the ``restarts``-th restart within the window."""
        if self.backoff_s == 0 or restarts <= 0:
            return 0.0
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (restarts - 1))
        spread = base * self.jitter
        jittered: float = base + random.uniform(-spread, spread)  # noqa: S311 - not crypto
        return max(0.0, jittered)
