"""How often a session may crash before its supervisor gives up on it."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["RestartPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartPolicy:
    """OTP's restart intensity: more than ``max_restarts`` crashes within
    ``within_s`` seconds (of the registry's clock) and the session is closed.

    ``backoff_s`` delays each restart by ``backoff_s * 2**(n-1)`` (n: crashes
    in the window), spread by ``jitter`` (a fraction, 0 to 1), capped at
    ``max_backoff_s``. The delay runs on the crashed session's own thread, so
    no other session waits for it.
    """

    max_restarts: int = 3
    within_s: float = 60.0
    backoff_s: float = 0.0
    max_backoff_s: float = 5.0
    jitter: float = 0.1

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if not self.within_s > 0:
            raise ValueError("within_s must be positive")
        if self.backoff_s < 0 or self.max_backoff_s < 0:
            raise ValueError("backoff must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")

    def allows_restart(self, crash_times: list[float], now: float) -> bool:
        """Whether a session may restart; drops crash times older than the window."""
        cutoff = now - self.within_s
        crash_times[:] = [t for t in crash_times if t > cutoff]
        return len(crash_times) <= self.max_restarts

    def backoff_s_for(self, restarts: int) -> float:
        """The delay before the ``restarts``-th restart within the window."""
        if self.backoff_s == 0 or restarts <= 0:
            return 0.0
        base = min(self.max_backoff_s, self.backoff_s * 2 ** (restarts - 1))
        spread = base * self.jitter
        jittered: float = base + random.uniform(-spread, spread)  # noqa: S311 - not crypto
        return max(0.0, jittered)
