"""The garbage collector's young threshold while a gateway runs.

What an event in flight makes (the engine's awaited send, the session's
journal entry and delivery, trio's waits) lives until the frame is written.
Under overload that is hundreds of milliseconds: with the interpreter's
young threshold (700 allocations) every such object outlives two young
collections, is promoted, and brings the next full collection nearer; full
collections of a heap of 1,000 sessions were about half of the server's CPU
at 1,000 clients (the README's gateway section). A young threshold of tens
of thousands lets those objects die young; each young collection then walks
at most that many objects (a pause of a few milliseconds).

The threshold is process-wide: the first gateway to start sets it, the last
to stop puts the interpreter's back.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["young_collections"]

#: Gateways running, and the thresholds they found (restored by the last).
_running: list[tuple[int, ...]] = []


@contextlib.contextmanager
def young_collections(threshold: int) -> Iterator[None]:
    """Run the block with the collector's young (generation 0) threshold at
    least ``threshold``; the interpreter's own thresholds come back after."""
    found = gc.get_threshold()
    _running.append(found)
    if threshold > found[0]:
        gc.set_threshold(threshold, *found[1:])
    try:
        yield
    finally:
        own = _running.pop()
        if not _running:
            gc.set_threshold(*own)
