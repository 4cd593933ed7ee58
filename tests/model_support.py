"""The model-based tests' harness (no tests here).

The transport the tests hand a registry (`ModelWire`, the one test
Wire with an id), an activation factory that keeps the tokens it was
handed, the `Door` protocol a front door's driver implements,
`answer_of` (a real result or error in the model's terms),
strategies, and `MachineCore`: the state, the calls (a crash is
checked to be the one armed, and means "no effect") and the checks after
every step. The rules are in ``tests/model_machine.py``; the model is
``tests/model.py``.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant

import actors._errors as err
from actors._commands import (
    DetachedAttachment,
    LifecycleEvent,
    ResumeResult,
    SessionCreated,
    TransportAttachment,
)
from actors._credential import ResumeToken
from actors._journal import JournalEntry
from supervisor._faults import FaultPlan
from supervisor.testing import Wire
from tests.model import Answer, Fail, RegistryModel, WireModel, cost_of

TTL, MAX_BYTES, START = 10.0, 400, 1000.0
LIMIT = 10.0  # real seconds any one call may take before the test calls it hung
SEND_TIMEOUT = 0.02  # the trio door's: only an injected hang ever reaches it
SIDS = ("a", "b")
#: Every sweep parks every detached, idle session; the model knows nothing of
#: it, so each answer after a sweep shows that parking is invisible.
PASSIVATE_AFTER_S = 0.0
LIFECYCLE_FAILPOINTS = FaultPlan.lifecycle_failpoint_names()
FAILPOINTS = FaultPlan.failpoint_names()
Crash = tuple[str, str] | None  # (failpoint, session) armed for one step
DoorCall = tuple[str, tuple[Any, ...], dict[str, Any]]
Observer = Callable[[LifecycleEvent], None]


class FactoryError(RuntimeError):
    """Raised by an activation factory told to fail."""


class ModelWire(Wire):
    """The one test Wire, with the id the model knows it by."""

    def __init__(self, wire_id: int) -> None:
        super().__init__()
        self.id = wire_id


class Activation:
    """An activation factory that keeps the rotated tokens it was handed."""

    def __init__(self, *, raises: bool) -> None:
        self.raises, self.tokens = raises, list[str]()

    def __call__(self, token: ResumeToken, generation: int) -> dict[str, object]:
        self.tokens.append(token.plaintext)
        if self.raises:
            raise FactoryError("activation factory failed")
        return {"type": "activation", "generation": generation}


class Door(Protocol):
    """How the machine reaches one front door, blocking, from the test's thread.

    ``call_many`` runs its calls concurrently and gives each one's result or
    the exception it raised; ``transport`` is the door's (send, close) pair.
    """

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any: ...
    def call_many(self, calls: Sequence[DoorCall]) -> list[Any]: ...
    def transport(self, wire: ModelWire) -> tuple[Any, Any]: ...
    def session_ids(self) -> list[str]: ...
    def shutdown(self) -> None: ...


# (error class, model kind, the built-in base the seed raised there)
_KINDS: tuple[tuple[type[BaseException], str, type[BaseException]], ...] = (
    (err.UnknownSessionError, "unknown", KeyError),
    (err.DuplicateSessionError, "duplicate", ValueError),
    (err.InvalidResumeTokenError, "token", RuntimeError),
    (err.JournalOverflowError, "overflow", RuntimeError),
    (err.InvalidSequenceError, "sequence", ValueError),
    (err.InvalidPayloadError, "payload", TypeError),
    (err.SendTimeoutError, "timeout", TimeoutError),
    (ConnectionResetError, "transport", ConnectionResetError),
    (FactoryError, "factory", FactoryError),
)


def answer_of(value: object) -> Answer:
    """A real result or error in the model's normalized form."""
    if isinstance(value, err.JournalGapError):
        assert isinstance(value, RuntimeError)
        return Fail("gap", (value.reason, value.requested, value.first_retained, value.head))
    if isinstance(value, err.SessionCrashedError):
        return Fail("crashed", (str(value.__cause__),))
    if isinstance(value, BaseException):
        for cls, kind, seed_base in _KINDS:
            if isinstance(value, cls):
                assert isinstance(value, seed_base), f"{value!r} is not a {seed_base.__name__}"
                return Fail(kind)
        raise AssertionError(f"unexpected error from the registry: {value!r}") from value
    if isinstance(value, JournalEntry):
        return ("entry", value.sequence, dict(value.payload))
    if isinstance(value, SessionCreated):
        return ("created", value.attachment_generation)
    if isinstance(value, DetachedAttachment):
        return ("detached", value.attachment_generation, value.lease_generation)
    if isinstance(value, TransportAttachment):
        return ("attachment", value.generation)
    if isinstance(value, ResumeResult):
        replaced = value.replaced_attachment
        replay = tuple(dict(e.payload) for e in value.replay_entries)
        return ("resumed", value.attachment_generation, replay, replaced and replaced.generation)
    return value


def crashes(*commands: str) -> st.SearchStrategy[Crash]:
    """No crash, or (failpoint, session) to arm: mostly the rule's own command's."""
    near = [fp for fp in FAILPOINTS if fp.split(".")[0] in commands]
    return st.one_of(
        st.none(),
        st.tuples(st.sampled_from(near), st.sampled_from(SIDS)),
        st.tuples(st.sampled_from(FAILPOINTS), st.sampled_from(SIDS)),
    )


def per_door(menu: str) -> st.SearchStrategy[str]:
    """``"none"`` (no fault) two times in three, else one of the faults the door supports
    (``menu`` names a tuple on the machine's class)."""
    faults = st.runner().flatmap(lambda machine: st.sampled_from(getattr(machine, menu)))
    return st.one_of(st.just("none"), st.just("none"), faults)


def wait_until(predicate: Callable[[], bool]) -> None:
    deadline = time.monotonic() + LIMIT
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.001)


SID = st.sampled_from(SIDS)
TOKEN = st.one_of(
    st.just("current"),
    st.sampled_from(["current", "previous", "first", "recovery", "foreign", "garbage"]),
)
#: A sequence, named by where it is (see ``RegistryModel.seq``): mostly in range.
_IN_RANGE = ["head", "head-1", "head-2", "oldest", "zero"]
SEQ = st.one_of(st.sampled_from(_IN_RANGE), st.sampled_from([*_IN_RANGE, "head+1", "negative"]))
RARELY = st.integers(0, 4).map(lambda n: n == 4)  # True one time in five; shrinks to False


#: A resume that rotated the token, then rolled back (its activation failed).
ROLLED_BACK = (Fail("transport"), Fail("timeout"), Fail("factory"))
#: A resume rule's activation choice, as the model's ``activation`` argument.
Activation_ = Literal["none", "ok", "fail", "hang", "factory"]
ACTIVATION_KINDS: dict[str, Activation_] = {
    "none": "none", "ok": "ok", "factory_raises": "factory",
    "wire_fail": "fail", "plan_fail": "fail", "plan_hang": "hang",
}  # fmt: skip


def resume_call(
    sid: str, token: str, seq: int, wire: tuple[ModelWire, Any, Any], factory: Activation | None
) -> DoorCall:
    kwargs = {
        "resume_token": token,
        "last_received_server_event_seq": seq,
        "send": wire[1],
        "close": wire[2],
        "activation_payload_factory": factory,
        "lease_generation": None,
    }
    return ("resume", (sid,), kwargs)


def issued_token(raw: object, factory: Activation | None) -> str | None:
    """The token a resume rotated to: its result's, or the one its activation was handed."""
    token = raw.resume_token.plaintext if isinstance(raw, ResumeResult) else None
    if factory is not None and factory.tokens:
        assert token in (None, factory.tokens[-1]), "the activation got another token"
        token = factory.tokens[-1]
    return token


def event_payload(
    model: RegistryModel, sid: str, n: int, *, kind: str, text: str, size: str
) -> dict[str, object]:
    """Event ``n``: text, or audio bytes (not JSON: a journal refuses it). ``size`` other
    than ``as_drawn`` pads the drawn text with ASCII so the event costs exactly the
    journal's free bytes (``exact_fit``) or one more (``one_byte_over``), if it can."""
    payload: dict[str, object] = {"n": n, "kind": kind}
    payload["text" if kind == "text" else "pcm"] = text if kind == "text" else text.encode()
    s = model.sessions.get(sid)
    if s is not None and kind == "text" and size != "as_drawn":
        drawn = cost_of({**payload, "server_event_seq": s.next_seq})
        pad = model.free_bytes(sid) - drawn + (size == "one_byte_over")
        payload["text"] = text + "x" * max(pad, 0)
    return payload


def arm_send_fault(
    plan: FaultPlan,
    model: RegistryModel,
    sid: str,
    wire: ModelWire,
    fault: str,
    *,
    nth: int,
    generation: int | None,
) -> None:
    """Make the ``nth`` frame to ``wire`` (``sid``'s attachment ``generation``) fail or hang."""
    if fault == "wire_fail":
        # ``nth`` counts the attachment's sends, plan-failed ones too, which
        # never reached the wire: count on from the wire's own sends.
        ahead = nth - model.wire(wire.id).attempts
        wire.fail(wire.sends + ahead, ConnectionResetError("wire send failed"))
    elif fault == "plan_fail":
        plan.fail_send(sid, nth=nth, generation=generation)
    elif fault == "plan_hang":
        plan.hang_send(sid, nth=nth, generation=generation)


def landing(
    sid: str, token: str, seq: int, *, wire_id: int, new_token: str | None, kind: Activation_
) -> Callable[[RegistryModel], Answer]:
    """A resume as the model applies it, for `RegistryModel.linearize`."""

    def land(model: RegistryModel) -> Answer:
        return model.resume(
            sid, token, seq, wire=wire_id, lease=None, new_token=new_token, activation=kind
        )

    return land


class QuietLogs:
    """Silence the library's loggers until ``restore()``."""

    def __init__(self) -> None:
        self._logger = logging.getLogger("duplex_supervisor")
        self._level = self._logger.level
        self._logger.setLevel(logging.CRITICAL)

    def restore(self) -> None:
        self._logger.setLevel(self._level)


def fresh(model: RegistryModel, token: str | None) -> str | None:
    """A token a resume just issued: never one issued before (every resume rotates)."""
    assert all(token not in issued for issued in model.issued.values()), "token reused"
    return token


CRASHED = object()  # what ask() answers for a call that crashed
_SUPERVISED = ("create", "close", "sweep")  # the calls that pass through the supervisor


class MachineCore(RuleBasedStateMachine):
    """The state, the calls and the checks after every step; the rules are in
    ``tests/model_machine.py``."""

    door_factory: Callable[[FaultPlan, Observer], Door]
    SEND_FAULTS: tuple[str, ...] = ("wire_fail",)
    ACTIVATIONS: tuple[str, ...] = ("ok", "factory_raises", "wire_fail")

    def __init__(self) -> None:
        super().__init__()
        self.plan = FaultPlan()
        self.model = RegistryModel(ttl_s=TTL, max_bytes=MAX_BYTES, now=START)
        self.wires: dict[int, ModelWire] = {}
        self.accepted: list[object] = []  # on_accepted tags, as they ran
        self.serial = itertools.count(1)
        self.armed: Crash = None
        self.supervisor_armed = False
        self.events: list[LifecycleEvent] = []  # what the registry told its observer
        self.door = type(self).door_factory(self.plan, self.events.append)
        self.quiet = QuietLogs()  # injected crashes log by the hundred; the trace says enough

    def teardown(self) -> None:
        self.door.shutdown()
        self.quiet.restore()

    # -- helpers -------------------------------------------------------------------

    def new_wire(self) -> tuple[ModelWire, Any, Any]:
        wire = ModelWire(next(self.serial))
        self.wires[wire.id] = wire
        return (wire, *self.door.transport(wire))

    def arm(self, crash: Crash, supervisor: bool = False) -> None:
        self.armed, self.supervisor_armed = crash, supervisor
        if crash is not None:
            self.plan.crash(crash[0], session_id=crash[1])
        if supervisor:
            self.plan.crash_supervisor()

    def ask(self, command: str, sid: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call the door: (raw result, answer), or (error, CRASHED): no effect, model untouched."""
        fp = self.armed[0] if self.armed is not None else ""
        before = self.plan.fired[fp]
        try:
            raw: Any = self.door.call(method, *args, **kwargs)
        except Exception as exc:
            raw = exc
        answer = answer_of(raw)
        ours = self.armed == (fp, sid) and fp.split(".")[0] == command
        fired = self.plan.fired[fp] > before
        supervised = self.supervisor_armed and command in _SUPERVISED
        if isinstance(answer, Fail) and answer.kind == "crashed":
            cause = answer.detail[0]
            if supervised:
                assert "injected supervisor crash" in str(cause), cause
            else:
                assert ours and fired, f"{method} crashed, but not at an armed failpoint: {cause}"
                assert cause == f"injected fault at {fp} in session {sid}", cause
            note(f"    {method}({sid!r}) crashed: no effect")
            self.armed, self.supervisor_armed = None, False
            return raw, CRASHED
        assert not supervised, f"{method} went through a crashing supervisor unharmed"
        assert not (ours and fired), f"{fp} fired in {method}({sid!r}), yet it did not crash"
        return raw, answer

    def check(self, what: str, real: Answer, expected: Answer, *, show: bool = True) -> None:
        if show:  # a failing example's trace prints it just above its step
            note(f"    {what} -> {real!r}")
        assert real == expected, f"{what}: the registry answered {real!r}, the model {expected!r}"

    def simple(self, sid: str, method: str, *args: Any, model: Any) -> None:
        """Call ``method`` (named as its failpoints are); compare unless it crashed."""
        _, real = self.ask(method, sid, method, sid, *args)
        if real is not CRASHED:
            self.check(f"{method}{args}", real, model(sid, *args))

    def probe(self, sid: str, seq: int, which: str = "current") -> None:
        """What a resume from ``seq`` with ``which`` token would replay (or why not)."""
        token = self.model.token(sid, which)
        kwargs = {"resume_token": token, "last_received_server_event_seq": seq}
        _, real = self.ask("", sid, "authenticate_resume", sid, **kwargs)
        expected = self.model.authenticate_resume(sid, token, seq)
        self.check(f"{sid}: {which} token, replay after {seq}", real, expected, show=False)

    # -- after every step ---------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self) -> None:
        self.plan.clear()  # faults armed for the step that ended and never hit
        self.armed, self.supervisor_armed = None, False
        for wire in self.wires.values():
            wire.disarm()
            expected = self.model.wires.get(wire.id, WireModel())
            wait_until(lambda: len(wire.closes) >= len(expected.closes))  # noqa: B023
            frames, closes = list(wire.frames), list(wire.closes)
            seqs = [int(str(f["server_event_seq"])) for f in frames if "server_event_seq" in f]
            assert seqs == sorted(set(seqs)), f"wire {wire.id}: not in journal order: {seqs}"
            assert frames == expected.frames, f"wire {wire.id}: {frames} != {expected.frames}"
            assert closes == expected.closes, f"wire {wire.id} closes: {closes}"
        wait_until(lambda: len(self.accepted) >= len(self.model.accepted))
        assert self.accepted == self.model.accepted, "on_accepted ran for other events"
        assert sorted(self.door.session_ids()) == sorted(self.model.sessions)
        assert all("<not issued>" not in t for t in self.model.issued.values()), "token not seen"
        for sid in sorted(self.model.sessions):
            self.probe(sid, 0)  # every accepted event: acked, replayable, or a typed gap
            for which in ("previous", "recovery"):  # a dead token stays dead
                self.probe(sid, self.model.seq(sid, "head"), which)
