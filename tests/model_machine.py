"""The model-based test, written once for every front door (no tests here: the door
files ``test_model_trio.py`` and ``test_model_threads.py`` subclass it).

`RegistryMachine` drives a real registry through a door driver and the model
of ``tests/model.py`` side by side, under crashes at random failpoints, supervisor
crashes, transport failures and hangs, and clock jumps; each rule waits for its
answers. After each step: every answer equalled the model's (``SessionCrashedError``
is "no effect", from the fault armed for that very call); each transport got exactly
the model's frames (so in journal order, none repeated) and closes; ``on_accepted``
ran for exactly the accepted events; each accepted journaled event is acknowledged,
replayable, or reported by a typed gap; dead tokens stay dead. After each resume that
rotated, the observer's ``resumed`` event carries the model's generation and lease.
"""

from __future__ import annotations

from typing import Literal

from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from actors._commands import SessionCreated
from tests.model import Fail
from tests.model_support import (
    ACTIVATION_KINDS,
    CRASHED,
    LIFECYCLE_FAILPOINTS,
    RARELY,
    ROLLED_BACK,
    SEQ,
    SID,
    SIDS,
    TOKEN,
    TTL,
    Activation,
    Crash,
    MachineCore,
    answer_of,
    arm_send_fault,
    crashes,
    event_payload,
    fresh,
    issued_token,
    landing,
    per_door,
    resume_call,
    wait_until,
)


class RegistryMachine(MachineCore):
    """The rules. A subclass sets ``door_factory`` and the fault menus its door supports."""

    @initialize()
    def open_sessions(self) -> None:
        for sid in SIDS:
            self.create(sid=sid, lease=0, supervisor_crash=False)

    @rule(sid=SID, lease=st.integers(0, 3), supervisor_crash=RARELY)
    def create(self, *, sid: str, lease: int, supervisor_crash: bool) -> None:
        wire, send, close = self.new_wire()
        self.arm(None, supervisor_crash)
        kwargs = {"send": send, "close": close, "lease_generation": lease}
        raw, real = self.ask("create", sid, "create", sid, **kwargs)
        if real is not CRASHED:
            token = raw.resume_token.plaintext if isinstance(raw, SessionCreated) else None
            token = fresh(self.model, token)
            expected = self.model.create(sid, wire=wire.id, lease=lease, token=token)
            self.check("create", real, expected)

    @rule(
        sid=SID,
        kind=st.sampled_from(["text", "text", "text", "audio"]),
        text=st.text('abé日😀"', max_size=12),
        size=st.sampled_from(["as_drawn"] * 4 + ["exact_fit", "one_byte_over"]),
        journal=st.booleans(),
        fault=per_door("SEND_FAULTS"),
        crash=crashes("send_event"),
    )
    def send_event(
        self,
        *,
        sid: str,
        kind: str,
        text: str,
        size: str,
        journal: bool,
        fault: str,
        crash: Crash,
    ) -> None:
        n = next(self.serial)
        payload = event_payload(self.model, sid, n, kind=kind, text=text, size=size)
        s = self.model.sessions.get(sid)
        fate: Literal["ok", "fail", "hang"] = "ok"
        if s is not None and s.wire is not None and fault != "none":
            fate = "hang" if fault == "plan_hang" else "fail"
            nth = self.model.wire(s.wire).attempts + 1
            wire, generation = self.wires[s.wire], s.generation
            arm_send_fault(self.plan, self.model, sid, wire, fault, nth=nth, generation=generation)
        self.arm(crash)
        kwargs = {"journal": journal, "on_accepted": lambda: self.accepted.append(n)}
        _, real = self.ask("send_event", sid, "send_event", sid, payload, **kwargs)
        if real is not CRASHED:
            expected = self.model.send_event(sid, payload, journal=journal, tag=n, fate=fate)
            self.check("send_event", real, expected)

    @rule(sid=SID, text=st.text("ab", max_size=6))
    def send_text(self, *, sid: str, text: str) -> None:
        """A plain journaled event: no fault, no crash (``send_event`` draws those)."""
        kwargs = {"kind": "text", "size": "as_drawn", "journal": True, "fault": "none"}
        self.send_event(sid=sid, text=text, crash=None, **kwargs)

    @rule(sid=SID, at=SEQ, crash=crashes("acknowledge"))
    def acknowledge(self, *, sid: str, at: str, crash: Crash) -> None:
        self.arm(crash)
        self.simple(sid, "acknowledge", self.model.seq(sid, at), model=self.model.acknowledge)

    @rule(
        sid=SID,
        which=st.sampled_from(["current", "stale", "any"]),
        via_detach=st.booleans(),
        crash=crashes("release_attachment"),
    )
    def detach(self, *, sid: str, which: str, via_detach: bool, crash: Crash) -> None:
        s = self.model.sessions.get(sid)
        current = s.generation if s is not None else 1
        generation = {"current": current, "stale": current - 1, "any": None}[which]
        method = "detach" if via_detach else "release_attachment"
        self.arm(crash)
        _, real = self.ask("release_attachment", sid, method, sid, attachment_generation=generation)
        if real is not CRASHED:
            expected = self.model.release_attachment(sid, generation)
            self.check(method, real, (expected is not None) if via_detach else expected)

    @rule(sid=SID, call=st.sampled_from(["begin_resume", "end_resume"]),
          crash=crashes("begin_resume", "end_resume"))  # fmt: skip
    def claim(self, *, sid: str, call: str, crash: Crash) -> None:
        self.arm(crash)
        self.simple(sid, call, model=getattr(self.model, call))

    @rule(sid=SID, lease=st.integers(0, 6), crash=crashes("settle_lease_generation"))
    def settle_lease_generation(self, *, sid: str, lease: int, crash: Crash) -> None:
        self.arm(crash)
        self.simple(sid, "settle_lease_generation", lease, model=self.model.settle_lease_generation)

    @rule(
        sid=SID, which=st.integers(-1, 1), crash=crashes("has_attachment", "is_current_attachment")
    )
    def query_attachment(self, *, sid: str, which: int, crash: Crash) -> None:
        s = self.model.sessions.get(sid)
        generation = (s.generation if s is not None else 1) + which
        self.arm(crash)
        self.simple(sid, "has_attachment", model=self.model.has_attachment)
        self.simple(
            sid, "is_current_attachment", generation, model=self.model.is_current_attachment
        )

    @rule(sid=SID, which=st.integers(-1, 0), crash=crashes("abort_resume"))
    def abandon_resume(self, *, sid: str, which: int, crash: Crash) -> None:
        s = self.model.sessions.get(sid)
        gen = (s.generation if s is not None else 1) + which
        self.arm(crash)
        _, real = self.ask("abort_resume", sid, "abandon_resume", sid, attachment_generation=gen)
        if real is not CRASHED:
            self.check(f"abandon_resume {gen}", real, self.model.abandon_resume(sid, gen))

    @rule(sid=SID, token=TOKEN, at=SEQ, crash=crashes("authenticate_resume"))
    def authenticate_resume(self, *, sid: str, token: str, at: str, crash: Crash) -> None:
        presented, seq = self.model.token(sid, token), self.model.seq(sid, at)
        self.arm(crash)
        kwargs = {"resume_token": presented, "last_received_server_event_seq": seq}
        _, real = self.ask("authenticate_resume", sid, "authenticate_resume", sid, **kwargs)
        if real is not CRASHED:
            expected = self.model.authenticate_resume(sid, presented, seq)
            self.check(f"authenticate_resume {token} {seq}", real, expected)

    @rule(
        sid=SID,
        token=TOKEN,
        at=SEQ,
        activation=per_door("ACTIVATIONS"),
        fail_at=st.integers(1, 3),
        lease=st.none() | st.integers(0, 6),
        crash=crashes("resume", "activation_outcome"),
    )
    def resume(
        self,
        *,
        sid: str,
        token: str,
        at: str,
        activation: str,
        fail_at: int,
        lease: int | None,
        crash: Crash,
    ) -> None:
        self.resume_once(
            sid=sid, token=token, at=at, activation=activation, fail_at=fail_at, lease=lease,
            crash=crash,
        )  # fmt: skip

    def resume_once(
        self,
        *,
        sid: str,
        token: str,
        at: str,
        activation: str,
        fail_at: int,
        lease: int | None,
        crash: Crash,
    ) -> object:
        """A resume, compared with the model; its answer (``CRASHED`` if it crashed)."""
        presented, seq = self.model.token(sid, token), self.model.seq(sid, at)
        wire = self.new_wire()
        raises = activation == "factory_raises"
        factory = None if activation == "none" else Activation(raises=raises)
        s = self.model.sessions.get(sid)
        generation = s.generation + 1 if s is not None else None
        arm_send_fault(
            self.plan, self.model, sid, wire[0], activation, nth=fail_at, generation=generation
        )
        self.arm(crash)
        mark = len(self.events)
        *_, kwargs = resume_call(sid, presented, seq, wire, factory)
        raw, real = self.ask("resume", sid, "resume", sid, **{**kwargs, "lease_generation": lease})
        if real is not CRASHED:
            new_token = fresh(self.model, issued_token(raw, factory))
            expected = self.model.resume(
                sid,
                presented,
                seq,
                wire=wire[0].id,
                lease=lease,
                new_token=new_token,
                activation=ACTIVATION_KINDS[activation],
                fail_at=fail_at,
            )
            self.check(f"resume {token} {seq}", real, expected)
            if isinstance(expected, tuple) or expected in ROLLED_BACK:
                self.heard_resumed(sid, since=mark)
        return real

    def heard_resumed(self, sid: str, *, since: int) -> None:
        """The observer was told of the resume, with the generation and lease it serves."""

        def told() -> list[tuple[int | None, int | None]]:
            events = [e for e in self.events[since:] if e.kind == "resumed"]
            return [(e.attachment_generation, e.lease_generation) for e in events]

        wait_until(lambda: bool(told()))
        s = self.model.sessions[sid]
        assert told() == [(s.generation, s.lease)], f"{sid}: told {told()}, model {s.lease}"

    @rule(
        sid=SID,
        token=TOKEN,
        at=SEQ,
        activation=per_door("ACTIVATIONS"),
        fail_at=st.integers(1, 3),
        lease=st.integers(1, 8),
        rival=st.none() | st.integers(1, 8),
    )
    def engine_resume(
        self,
        *,
        sid: str,
        token: str,
        at: str,
        activation: str,
        fail_at: int,
        lease: int,
        rival: int | None,
    ) -> None:
        """The seed's engine protocol: claim the resume, resume with the engine's new lease
        generation, settle that lease if the resume never served, release the claim. A
        ``rival`` engine abandons its own resume meanwhile: its lease waits for ours."""
        self.claim(sid=sid, call="begin_resume", crash=None)
        if rival is not None:
            self.claim(sid=sid, call="begin_resume", crash=None)
            self.settle_lease_generation(sid=sid, lease=rival, crash=None)
            self.claim(sid=sid, call="end_resume", crash=None)
        answer = self.resume_once(
            sid=sid, token=token, at=at, activation=activation, fail_at=fail_at, lease=lease,
            crash=None,
        )  # fmt: skip
        if not isinstance(answer, tuple):
            self.settle_lease_generation(sid=sid, lease=lease, crash=None)
        self.claim(sid=sid, call="end_resume", crash=None)

    @rule(sid=SID, at=SEQ, with_activation=st.booleans())
    def resume_twice_concurrently(self, *, sid: str, at: str, with_activation: bool) -> None:
        """Same token, at once: in any interleaving one wins and the other is refused."""
        presented, seq = self.model.token(sid, "current"), self.model.seq(sid, at)
        wires = [self.new_wire(), self.new_wire()]
        factories = [Activation(raises=False) if with_activation else None for _ in wires]
        calls = [
            resume_call(sid, presented, seq, w, f) for w, f in zip(wires, factories, strict=True)
        ]
        raws = self.door.call_many(calls)
        reals = [answer_of(raw) for raw in raws]
        pairs = zip(raws, factories, strict=True)
        tokens = [fresh(self.model, issued_token(raw, f)) for raw, f in pairs]
        kind: Literal["ok", "none"] = "ok" if with_activation else "none"
        lands = [
            landing(sid, presented, seq, wire_id=w[0].id, new_token=t, kind=kind)
            for w, t in zip(wires, tokens, strict=True)
        ]
        model = self.model.linearize(lands, reals)
        assert model is not None, f"no interleaving explains {reals}"
        self.model = model
        note(f"    two resumes -> {reals!r}")
        winners = [i for i, answer in enumerate(reals) if isinstance(answer, tuple)]
        assert len(winners) <= 1 and (not winners or Fail("token") in reals)

    @rule(sid=SID, reopen=st.booleans(), supervisor_crash=RARELY, crash=crashes("close"))
    def close(self, *, sid: str, reopen: bool, supervisor_crash: bool, crash: Crash) -> None:
        """Close ``sid``; with ``reopen``, create it again at once (a new session, same id)."""
        self.arm(crash, supervisor_crash)
        _, real = self.ask("close", sid, "close", sid)
        if real is CRASHED:
            return
        existed = sid in self.model.sessions
        self.check("close", real, self.model.close(sid))
        if existed:  # wait until it left the supervisor's books: no stray supervisor message
            assert self.door.call("close", "\x00barrier") is None
        if reopen:
            self.create(sid=sid, lease=0, supervisor_crash=False)

    @rule(
        seconds=st.sampled_from([1.0, TTL - 1, TTL, TTL + 1]),
        supervisor_crash=RARELY,
        crash=crashes("tick"),
    )
    def jump_clock_and_sweep(self, *, seconds: float, supervisor_crash: bool, crash: Crash) -> None:
        self.plan.jump_clock(seconds)
        self.model.jump(seconds)
        self.arm(crash, supervisor_crash)
        _, real = self.ask("sweep", "", "sweep")
        if real is not CRASHED:
            self.check("sweep", real, None)
            self.model.sweep()

    @rule(
        sid=SID,
        crash=st.one_of(st.none(), st.sampled_from(LIFECYCLE_FAILPOINTS)),
        supervisor_crash=RARELY,
    )
    def park_and_wake(self, *, sid: str, crash: str | None, supervisor_crash: bool) -> None:
        """A sweep without a clock jump parks every idle detached session (passivation
        is on with no delay); the next call wakes ``sid``. A crash while parking
        leaves it live, one while waking is restarted: neither is seen by a caller."""
        self.arm(None, supervisor_crash)
        if crash is not None:  # never the caller's crash: armed beside arm()
            self.plan.crash(crash, session_id=sid)
        _, real = self.ask("sweep", "", "sweep")
        if real is not CRASHED:
            self.check("sweep", real, None)
            self.model.sweep()
        _, real = self.ask("has_attachment", sid, "has_attachment", sid)
        self.check("has_attachment", real, self.model.has_attachment(sid))

    @rule(sid=SID)
    def audit_journal(self, *, sid: str) -> None:
        """Every sequence from -1 to head + 1: replayable, a typed gap, or out of range."""
        s = self.model.sessions.get(sid)
        for seq in range(-1, s.head + 2) if s is not None else ():
            self.probe(sid, seq)
