"""What a session keeps across its connections, without I/O.

`InputLedger` is a session's answered ids, kept for the session's
whole life (across connections): it decides whether an input is new, a
repeat, over the in-flight cap or past the lifetime bound.

`ClientSequence` is a session's last accepted ``client_seq`` (O(1) per
session, across connections, plus the runs a store says another process
handled above it): each sequenced client event is accepted once, in order; a
repeat is dropped and counted, a jump ahead refused.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from actors._client_seqs import ClientWatermark, Runs

__all__ = ["ClientSequence", "InputLedger", "InputVerdict", "SequenceVerdict"]

#: What `InputLedger.decide` says about an input.
InputVerdict = Literal["answer", "duplicate", "busy", "input_limit"]

#: What `ClientSequence.accept` says about a client event's ``client_seq``.
SequenceVerdict = Literal["accepted", "repeat", "ahead"]


def _digest(client_event_id: str) -> bytes:
    return hashlib.blake2b(client_event_id.encode("utf-8"), digest_size=16).digest()


@dataclass(slots=True)
class InputLedger:
    """One session's inputs for its whole life: answered ids (16-byte digests),
    answers in flight. Only an input to answer is remembered."""

    max_ids: int
    max_in_flight: int
    answered: set[bytes] = field(default_factory=set)
    in_flight: int = 0

    def decide(self, client_event_id: str) -> InputVerdict:
        digest = _digest(client_event_id)
        if digest in self.answered:
            return "duplicate"
        if len(self.answered) >= self.max_ids:
            return "input_limit"
        if self.in_flight >= self.max_in_flight:
            return "busy"
        self.answered.add(digest)
        self.in_flight += 1
        return "answer"

    def done(self) -> None:
        """One answer finished (sent, or given up with its session)."""
        self.in_flight = max(0, self.in_flight - 1)


@dataclass(slots=True)
class ClientSequence:
    """A session's last accepted ``client_seq``, the repeats it dropped, and the
    runs above ``last`` handled elsewhere (by a process that held the session
    before, as its store says): repeats too, once the client resends them."""

    last: int = 0
    repeats: int = 0
    handled_above: Runs = ()

    def accept(self, client_seq: int) -> SequenceVerdict:
        if client_seq <= self.last:
            self.repeats += 1
            return "repeat"
        if client_seq != self.last + 1:
            return "ahead"
        self.last = client_seq
        runs = self.handled_above
        if runs and runs[0][0] <= client_seq:
            if client_seq >= runs[0][1]:
                self.handled_above = runs[1:]
            self.repeats += 1
            return "repeat"
        return "accepted"

    def catch_up(self, stored: ClientWatermark) -> None:
        """Take in what the store says was handled (by any process)."""
        ours = ClientWatermark(last_client_seq=self.last, handled_above=self.handled_above)
        merged = ours.merged(stored)
        self.last, self.handled_above = merged.last_client_seq, merged.handled_above
