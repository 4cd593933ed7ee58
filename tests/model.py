"""A sequential reference model of the seed registry's semantics (tests only).

Written from the seed (``/work/shared/seed/session_attachment_seed.py.txt``) and
DESIGN.md, never from ``actors/``: dicts and lists, one call at a time, no I/O.
Each method takes what a caller passed, plus what the model cannot predict (the
tokens the real system issued; what the transport does with each frame), changes
the model as the seed would, and returns the *answer*, normalized: a value
(``("created", generation)``, ``("entry", seq, payload)``, ``("detached",
generation, lease)``, ``("attachment", generation)``, ``("resumed", generation,
replay_payloads, replaced_generation)``, ``None``, a bool or an int), or a
`Fail` naming the seed's error (``unknown``: its ``KeyError``;
``duplicate``, ``sequence``, ``payload``: ``ValueError``/``TypeError``; ``token``,
``gap``, ``overflow``: ``RuntimeError``) or the transport's (``transport``,
``timeout``, ``factory``).

Beyond the seed, from DESIGN.md and the doors' docstrings: a rejected payload
changes nothing; a gap names why the first missing event went; the library gives
up on a transport whose send timed out (later frames to it are dropped, answered
as sent; it is closed with ``"send_timeout"``); ``sweep`` prunes by TTL now;
``abandon_resume`` undoes the standing resume as a failed activation would.
"""

from __future__ import annotations

import copy
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Answer", "Fail", "RegistryModel", "SessionModel", "WireModel", "cost_of"]

#: What the transport does with a frame: delivered, raises, or hangs past the timeout.
FrameFate = Literal["ok", "fail", "hang"]
Answer = object


@dataclass(frozen=True)
class Fail:
    """An error answer: its kind and, for a gap, (reason, requested, first_retained, head)."""

    kind: str
    detail: tuple[object, ...] = ()


@dataclass
class Event:
    seq: int
    created: float
    cost: int
    payload: dict[str, object]


@dataclass
class WireModel:
    """One transport: the frames that must have reached its ``send``, and its closes."""

    frames: list[dict[str, object]] = field(default_factory=list)
    attempts: int = 0  # frames handed to the transport, failed ones included
    dead: bool = False  # the library gave up on it (a send timed out)
    closes: list[str] = field(default_factory=list)


@dataclass
class SessionModel:
    token: str
    wire: int | None  # the attached transport's wire id; None while detached
    generation: int = 1
    lease: int = 0
    pending: int = 0
    orphan: int | None = None
    recovery: str | None = None
    last_recovery: str | None = None  # the last token a rollback made the recovery token
    last_resume: tuple[int, str] | None = None  # the standing resume: (generation, token)
    events: list[Event] = field(default_factory=list)  # retained, oldest first
    next_seq: int = 1
    dropped: dict[int, str] = field(default_factory=dict)  # seq -> why it went
    dropped_through: int = 0
    overflowed: bool = False

    @property
    def head(self) -> int:
        return self.next_seq - 1


def cost_of(sequenced: dict[str, object]) -> int:
    """The seed's byte cost: UTF-8 length of the compact JSON, ``ensure_ascii=False``."""
    text = json.dumps(sequenced, separators=(",", ":"), ensure_ascii=False)
    return len(text.encode("utf-8"))


def _is_json(value: object) -> bool:
    """Strict JSON (no NaN or infinity). The tests only ever use string keys."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


class RegistryModel:
    """The seed registry, sequential; see the module docstring."""

    def __init__(self, *, ttl_s: float, max_bytes: int, now: float) -> None:
        self.ttl_s, self.max_bytes, self.now = ttl_s, max_bytes, now
        self.sessions: dict[str, SessionModel] = {}
        self.wires: dict[int, WireModel] = {}
        self.accepted: list[object] = []  # on_accepted tags, in the order they must run
        self.issued: dict[str, list[str]] = {}  # per session id, every token fed in, oldest first

    def seq(self, sid: str, where: str) -> int:
        """``head``, ``head-1``, ``head-2`` (not below 0), ``oldest`` (the oldest sequence a
        replay can start from), ``zero``, ``head+1`` (too new), ``negative``."""
        s = self.sessions.get(sid)
        head, oldest = (s.head, s.dropped_through) if s is not None else (0, 0)
        offsets = {"head": 0, "head-1": 1, "head-2": 2}
        if where in offsets:
            return max(0, head - offsets[where])
        return {"oldest": oldest, "zero": 0, "head+1": head + 1, "negative": -1}[where]

    def token(self, sid: str, which: str) -> str:
        """``current``, ``previous``, ``first``, ``recovery`` (the last recovery token, even
        spent), ``foreign`` (another session's); anything else is garbage."""
        issued, s = self.issued.get(sid, []), self.sessions.get(sid)
        others = [t[-1] for k, t in sorted(self.issued.items()) if k != sid and t]
        chosen = {
            "current": s.token if s is not None else None,
            "previous": issued[-2] if len(issued) >= 2 else None,
            "first": issued[0] if issued else None,
            "recovery": s.last_recovery if s is not None else None,
            "foreign": others[0] if others else None,
        }.get(which)
        return chosen or "not-a-token"

    def linearize(
        self, ops: list[Callable[[RegistryModel], Answer]], answers: list[Answer]
    ) -> RegistryModel | None:
        """A copy of the model after ``ops`` ran one by one in some order in which each gave
        its answer in ``answers``; None if no order does (concurrent calls, checked)."""
        for order in itertools.permutations(range(len(ops))):
            model, got = copy.deepcopy(self), list[Answer]([None] * len(ops))
            for i in order:
                got[i] = ops[i](model)
            if got == answers:
                return model
        return None

    # -- time ----------------------------------------------------------------

    def jump(self, seconds: float) -> None:
        self.now += seconds

    def sweep(self) -> None:
        for session in self.sessions.values():
            self._prune(session)

    def _prune(self, s: SessionModel) -> None:
        cutoff = self.now - self.ttl_s
        while s.events and s.events[0].created <= cutoff:
            self._drop_head(s, "ttl")

    def _drop_head(self, s: SessionModel, reason: str) -> None:
        event = s.events.pop(0)
        s.dropped[event.seq] = reason
        s.dropped_through = max(s.dropped_through, event.seq)

    def free_bytes(self, sid: str) -> int:
        """What the session's journal can still take now (after pruning by TTL)."""
        s = self.sessions.get(sid)
        kept = [e for e in s.events if e.created > self.now - self.ttl_s] if s else []
        return self.max_bytes - sum(e.cost for e in kept)

    # -- the wire -------------------------------------------------------------

    def wire(self, wire_id: int) -> WireModel:
        return self.wires.setdefault(wire_id, WireModel())

    def _transmit(
        self, wire_id: int, frames: list[dict[str, object]], fates: list[FrameFate]
    ) -> str:
        """Send ``frames`` in order until one fails; return "ok", "fail" or "hang"."""
        wire = self.wire(wire_id)
        if wire.dead:
            return "ok"  # dropped unsent; the waiting caller is answered as if sent
        for frame, fate in zip(frames, fates, strict=True):
            wire.attempts += 1
            if fate == "hang":
                wire.dead = True
                wire.closes.append("send_timeout")
                return "hang"
            if fate == "fail":
                return "fail"
            wire.frames.append(frame)
        return "ok"

    # -- the seed's methods ---------------------------------------------------------

    def create(self, sid: str, *, wire: int, lease: int, token: str | None) -> Answer:
        if sid in self.sessions:
            return Fail("duplicate")
        self.sessions[sid] = SessionModel(token=token or "<not issued>", wire=wire, lease=lease)
        self.issued[sid] = [token or "<not issued>"]
        self.wire(wire)
        return ("created", 1)

    def send_event(
        self, sid: str, payload: dict[str, object], *, journal: bool, tag: object, fate: FrameFate
    ) -> Answer:
        s = self.sessions.get(sid)
        if s is None:
            return Fail("unknown")
        answer: Answer = None
        frame = dict(payload)
        if journal:
            if s.overflowed:
                return Fail("overflow")
            if not _is_json(payload):
                return Fail("payload")
            self._prune(s)
            frame["server_event_seq"] = s.next_seq
            cost = cost_of(frame)
            if sum(e.cost for e in s.events) + cost > self.max_bytes:
                s.overflowed = True
                return Fail("overflow")
            s.events.append(Event(s.next_seq, self.now, cost, frame))
            s.next_seq += 1
            self.accepted.append(tag)  # on_accepted: once journaled, whatever the send does
            answer = ("entry", s.head, frame)
        if s.wire is None:
            return answer
        outcome = self._transmit(s.wire, [frame], [fate])
        if outcome != "ok":
            return Fail("transport" if outcome == "fail" else "timeout")
        if not journal and not self.wire(s.wire).dead:
            self.accepted.append(tag)  # unjournaled: only once the send succeeded
        return answer

    def acknowledge(self, sid: str, seq: int) -> Answer:
        s = self.sessions.get(sid)
        if s is None:
            return Fail("unknown")
        if seq < 0 or seq > s.head:
            return Fail("sequence")
        removed = 0
        while s.events and s.events[0].seq <= seq:
            self._drop_head(s, "acknowledged")
            removed += 1
        s.dropped_through = max(s.dropped_through, seq)
        return removed

    def release_attachment(self, sid: str, generation: int | None) -> Answer:
        s = self.sessions.get(sid)
        if s is None or s.wire is None:
            return None
        if generation is not None and generation != s.generation:
            return None
        s.wire = None
        return ("detached", s.generation, s.lease)

    def begin_resume(self, sid: str) -> Answer:
        s = self.sessions.get(sid)
        if s is None:
            return Fail("unknown")
        s.pending += 1
        return None

    def end_resume(self, sid: str) -> Answer:
        s = self.sessions.get(sid)
        if s is None:
            return None
        s.pending = max(0, s.pending - 1)
        return self._settle_orphan(s)

    def settle_lease_generation(self, sid: str, lease: int) -> Answer:
        s = self.sessions.get(sid)
        if s is None:
            return None
        s.orphan = max(s.orphan or 0, lease)
        return self._settle_orphan(s)

    @staticmethod
    def _settle_orphan(s: SessionModel) -> int | None:
        if s.orphan is None or s.pending > 0:
            return None
        orphan, s.orphan = s.orphan, None
        if s.wire is not None:
            s.lease = max(s.lease, orphan)
            return None
        return orphan

    def has_attachment(self, sid: str) -> Answer:
        s = self.sessions.get(sid)
        return s is not None and s.wire is not None

    def is_current_attachment(self, sid: str, generation: int) -> Answer:
        s = self.sessions.get(sid)
        return s is not None and s.wire is not None and s.generation == generation

    def _check_token(self, s: SessionModel, token: str) -> Fail | bool:
        """``False``: the current token; ``True``: the recovery token; else a Fail."""
        if token == s.token:
            return False
        if s.wire is None and s.recovery is not None and token == s.recovery:
            return True
        return Fail("token")

    def _replay_after(self, s: SessionModel, seq: int) -> Fail | list[Event]:
        if seq < 0:
            return Fail("sequence")
        self._prune(s)
        first = s.events[0].seq if s.events else s.next_seq
        if s.overflowed:
            return Fail("gap", ("overflow", seq, first, s.head))
        if seq < s.dropped_through:
            return Fail("gap", (s.dropped[seq + 1], seq, first, s.head))
        if seq > s.head:
            return Fail("sequence")
        return [e for e in s.events if e.seq > seq]

    def authenticate_resume(self, sid: str, token: str, seq: int) -> Answer:
        s = self.sessions.get(sid)
        if s is None:
            return Fail("unknown")
        identity = self._check_token(s, token)
        if isinstance(identity, Fail):
            return identity
        replay = self._replay_after(s, seq)
        return replay if isinstance(replay, Fail) else None

    def resume(
        self,
        sid: str,
        token: str,
        seq: int,
        *,
        wire: int,
        lease: int | None,
        new_token: str | None,
        activation: Literal["none", "ok", "fail", "hang", "factory"] = "none",
        fail_at: int = 1,
    ) -> Answer:
        """``activation``: no factory, or what its frames meet (``fail_at``: which frame)."""
        s = self.sessions.get(sid)
        if s is None:
            return Fail("unknown")
        identity = self._check_token(s, token)
        if isinstance(identity, Fail):
            return identity
        replay = self._replay_after(s, seq)
        if isinstance(replay, Fail):
            return replay
        s.recovery = None
        s.token = new_token or "<not issued>"
        self.issued[sid].append(s.token)
        replaced = s.generation if s.wire is not None else None
        s.generation += 1
        s.wire = wire
        s.lease = max(s.lease, lease if lease is not None else 0, s.orphan or 0)
        s.orphan = None
        payloads = tuple(e.payload for e in replay)
        self.wire(wire)
        if activation != "none":
            frames = [{"type": "activation", "generation": s.generation}, *map(dict, payloads)]
            fates: list[FrameFate] = ["ok"] * len(frames)
            if activation in ("fail", "hang") and fail_at <= len(frames):
                fates[fail_at - 1] = "fail" if activation == "fail" else "hang"
            outcome = "factory" if activation == "factory" else self._transmit(wire, frames, fates)
            if outcome != "ok":
                self._roll_back(s, token)
                return Fail({"fail": "transport", "hang": "timeout"}.get(outcome, outcome))
        s.last_resume = (s.generation, token)
        return ("resumed", s.generation, payloads, replaced)

    @staticmethod
    def _roll_back(s: SessionModel, token: str) -> None:
        """The seed's rollback: detached, the presented token works once more (while
        detached), the lease the attachment served is parked for the next activation."""
        s.wire, s.last_resume = None, None
        s.recovery = s.last_recovery = token
        s.orphan = max(s.orphan or 0, s.lease)

    def abandon_resume(self, sid: str, generation: int) -> Answer:
        """Undo the resume of ``generation`` if it is the one standing; else ``False``."""
        s = self.sessions.get(sid)
        if s is None:
            return Fail("unknown")
        standing = s.last_resume
        if standing is None or standing[0] != generation or generation != s.generation:
            return False
        self._roll_back(s, standing[1])
        return True

    def close(self, sid: str) -> Answer:
        s = self.sessions.pop(sid, None)
        if s is None or s.wire is None:
            return None
        return ("attachment", s.generation)
