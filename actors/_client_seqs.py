"""Which sequenced client events were handled, as a session store keeps it.

A resume on another process starts from the stored ``last_client_seq``: the
client resends every client event above it. Events are handled out of order
(an input is handled once its answer ends, and audio chunks sent after it are
handled meanwhile), so the store keeps a watermark and what lies above it:
``last_client_seq``, through which every event was handled, and the runs of
events handled above it. The process that resumes takes those as repeats
(dropped, not handled twice) and handles the rest: an input whose answer was
in flight when its process died is answered there, once.

The runs stay few: each gap is an event accepted and not yet handled (an
answer in flight, an event queued for the engine), or one a process took
with it when it died, which the client resends to the next.

Plain data and pure functions; the Redis store (`supervisor/stores/_redis.py`)
keeps the same in Lua.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["ClientWatermark", "Runs", "parse_runs"]

#: Inclusive runs ``(first, last)`` of client_seqs, ascending, disjoint, none
#: touching the next.
Runs = tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientWatermark:
    """Every client event through ``last_client_seq`` was handled, and those in
    ``handled_above`` (runs that start above ``last_client_seq + 1``)."""

    last_client_seq: int = 0
    handled_above: Runs = ()

    def handled(self, client_seq: int) -> bool:
        return client_seq <= self.last_client_seq or any(
            first <= client_seq <= last for first, last in self.handled_above
        )

    def with_handled(self, client_seqs: Iterable[int]) -> ClientWatermark:
        """These events handled too."""
        runs = self.handled_above
        for seq in client_seqs:
            if seq > self.last_client_seq:
                runs = _add_run(runs, seq, seq)
        return _normalized(self.last_client_seq, runs)

    def merged(self, other: ClientWatermark) -> ClientWatermark:
        """Every event handled by either."""
        last = max(self.last_client_seq, other.last_client_seq)
        runs = self.handled_above
        for first, end in other.handled_above:
            runs = _add_run(runs, first, end)
        return _normalized(last, runs)


def _add_run(runs: Runs, first: int, last: int) -> Runs:
    merged: list[tuple[int, int]] = []
    placed = False
    for low, high in runs:
        if high < first - 1:
            merged.append((low, high))
        elif low > last + 1:
            if not placed:
                merged.append((first, last))
                placed = True
            merged.append((low, high))
        else:
            first, last = min(first, low), max(last, high)
    if not placed:
        merged.append((first, last))
    return tuple(merged)


def _normalized(last: int, runs: Runs) -> ClientWatermark:
    """The watermark moved up over the runs that reach it."""
    start = 0
    while start < len(runs) and runs[start][0] <= last + 1:
        last = max(last, runs[start][1])
        start += 1
    return ClientWatermark(last_client_seq=last, handled_above=runs[start:])


def parse_runs(text: str) -> Runs:
    """Runs as a store writes them: ``"first-last,first-last"``."""
    if not text:
        return ()
    pairs = (part.split("-", 1) for part in text.split(","))
    return tuple((int(first), int(last)) for first, last in pairs)
