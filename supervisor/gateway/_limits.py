"""The gateway's bookkeeping for its limits: counts, throttles, rates.

Plain data on the trio loop (one thread), fed the loop's clock by the caller,
so each is testable with plain calls and made-up times.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

__all__ = ["AddressCounter", "ByteRate", "FailureThrottle", "InputRate"]


class FailureThrottle:
    """More than ``allowed`` failures from one address within ``window_s``: blocked.

    Bounded and expiring: an address is forgotten once its newest failure is
    older than the window, and at most ``max_addresses`` are tracked (the one
    whose last failure is oldest goes first). An address that never failed is
    never stored.
    """

    def __init__(self, allowed: int, window_s: float, max_addresses: int) -> None:
        self._allowed = allowed
        self._window_s = window_s
        self._max_addresses = max_addresses
        # Ordered by last failure, oldest first.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._failures)

    def _expire(self, now: float) -> None:
        cutoff = now - self._window_s
        while self._failures:
            address, times = next(iter(self._failures.items()))
            if times[-1] > cutoff:
                break
            del self._failures[address]

    def blocked(self, address: str, now: float) -> bool:
        self._expire(now)
        times = self._failures.get(address)
        if times is None:
            return False
        cutoff = now - self._window_s
        return sum(t > cutoff for t in times) >= self._allowed

    def failed(self, address: str, now: float) -> None:
        self._expire(now)
        times = self._failures.pop(address, None)
        if times is None:
            times = deque(maxlen=self._allowed)
        times.append(now)
        self._failures[address] = times
        while len(self._failures) > self._max_addresses:
            self._failures.popitem(last=False)


class AddressCounter:
    """Things held per address and in total (connections, sessions), with caps."""

    def __init__(self, total: int, per_address: int) -> None:
        self.total_cap = total
        self.per_address_cap = per_address
        self.total = 0
        self._by_address: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._by_address)

    def refusal(self, address: str) -> str | None:
        """``"total"`` or ``"address"`` if one more would pass a cap, else ``None``."""
        if self.total >= self.total_cap:
            return "total"
        if self._by_address.get(address, 0) >= self.per_address_cap:
            return "address"
        return None

    def take(self, address: str) -> None:
        self.total += 1
        self._by_address[address] = self._by_address.get(address, 0) + 1

    def release(self, address: str) -> None:
        left = self._by_address.get(address, 0) - 1
        if left < 0:
            return
        self.total -= 1
        if left:
            self._by_address[address] = left
        else:
            del self._by_address[address]

    def held_by(self, address: str) -> int:
        return self._by_address.get(address, 0)


@dataclass(slots=True)
class InputRate:
    """A token bucket: ``per_second`` inputs a second, in bursts of as many (at least one)."""

    per_second: float
    _tokens: float = -1.0
    _at: float = 0.0

    def allow(self, now: float) -> bool:
        burst = max(1.0, self.per_second)
        if self._tokens < 0:
            self._tokens, self._at = burst, now
        self._tokens = min(burst, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@dataclass(slots=True)
class ByteRate:
    """A token bucket of bytes: ``per_second`` a second, in bursts of as many.

    A message larger than the burst passes once the bucket is full (so any
    message under the frame cap can go), and leaves the bucket that far in debt.
    """

    per_second: float
    _tokens: float = 0.0
    _at: float | None = None

    def allow(self, size: int, now: float) -> bool:
        if self._at is None:
            self._tokens, self._at = self.per_second, now
        self._tokens = min(self.per_second, self._tokens + (now - self._at) * self.per_second)
        self._at = now
        if self._tokens < min(size, self.per_second):
            return False
        self._tokens -= size
        return True
