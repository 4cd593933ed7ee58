"""The small loop-neutral protocols between a session actor and its shells.

A session actor runs in turns on its registry's event loop and never does
I/O, never calls user code inline and never blocks on a caller. It talks to the outside only
through these three things, each implemented once per front door:

* `Reply`: answers one caller. Thread-safe; the first answer wins and
  later ones are ignored, so a caller that gave up costs nothing.
* `LoopPort`: runs a callable soon on the loop that owns it (trio's
  ``run_sync_soon``, asyncio's ``call_soon_threadsafe``, a dispatcher thread).
  Used for ``on_accepted`` and observer callbacks.
* `Outbox`: one attachment generation's ordered delivery queue, owned by
  the loop that created the attachment. It sends frames in the order posted
  and resolves the waiting caller (or, for an activation, reports the outcome
  to the session first).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

from actors._commands import Activate, ActivationOutcome, Deliver
from actors._errors import SessionFailedError
from actors._quick_init import quick_init

__all__ = [
    "NO_WAITER",
    "Delivery",
    "LoopPort",
    "NoWaiter",
    "Outbox",
    "Reply",
    "delivery_frames",
    "settle_delivered",
    "settle_dropped",
    "settle_failed",
]


class Reply(Protocol):
    """One caller's answer slot. Thread-safe; the first answer wins."""

    def resolve(self, value: object) -> None: ...

    def fail(self, error: BaseException) -> None: ...


class LoopPort(Protocol):
    """Runs callables on the loop that owns it, in submission order.

    It is also the loop every actor of the registry runs on
    (`actors._loop_actor.LoopActor`).
    """

    def submit(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` soon on the loop; callable from any thread."""

    def on_loop(self) -> bool:
        """Whether the caller runs on the loop's own thread."""


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class Delivery:
    """One effect for an outbox, with who waits on it.

    ``reply`` gets ``value`` once every frame was sent, or the first send's
    exception. For an `Activate`, ``report`` is told
    the outcome before ``reply`` is answered, so a resume queued behind this
    one sees the rollback.
    """

    effect: Deliver | Activate
    reply: Reply | None = field(default=None, repr=False)
    value: object = field(default=None, repr=False)
    report: Callable[[ActivationOutcome], None] | None = field(default=None, repr=False)


class Outbox(Protocol):
    """One attachment generation's wire, seen from the actor."""

    def post(self, delivery: Delivery) -> None:
        """Queue ``delivery`` behind everything posted before. Never blocks."""

    def retire(self, reason: str) -> None:
        """Stop: nothing more is sent. Waiting callers are answered as if the
        attachment had gone away; a pending activation reports failure."""

    def close_transport(self, reason: str) -> None:
        """Retire, then call the transport's ``close(reason)`` on its loop."""


class NoWaiter:
    """The reply of a call nobody waits for (``send_event_nowait``).

    An outbox whose frame for such a call fails gives up on the transport
    itself: nobody else would learn of the failure.
    """

    __slots__ = ()

    def resolve(self, value: object) -> None:
        return None

    def fail(self, error: BaseException) -> None:
        return None


NO_WAITER = NoWaiter()


def delivery_frames(effect: Deliver | Activate) -> Iterator[dict[str, object]]:
    """The frames of one delivery, each a fresh plain dict, in wire order.

    For an activation the caller's factory is called here, on the outbox's
    loop, so a factory that raises is a failed activation, as in the seed.
    """
    if isinstance(effect, Activate):
        factory = effect.payload_factory
        with_count = getattr(factory, "activation_payload", None)
        if with_count is not None:
            # A ReplayCountingFactory also learns how many events follow.
            yield dict(
                with_count(effect.resume_token, effect.attachment_generation, len(effect.replay))
            )
        else:
            yield dict(factory(effect.resume_token, effect.attachment_generation))
        for entry in effect.replay:
            yield entry.fresh_payload()
    else:
        for frame in effect.frames:
            yield dict(frame)


def settle_delivered(delivery: Delivery) -> None:
    """Every frame went out: report an activation, then answer the caller."""
    effect = delivery.effect
    if delivery.report is not None and isinstance(effect, Activate):
        delivery.report(
            ActivationOutcome(attachment_generation=effect.attachment_generation, delivered=True)
        )
    if delivery.reply is not None:
        delivery.reply.resolve(delivery.value)


def settle_failed(delivery: Delivery, error: BaseException) -> bool:
    """A send failed: roll an activation back, then fail the caller.

    Returns whether a caller waits for it; if not, the outbox must give up
    on the transport itself.
    """
    effect = delivery.effect
    if delivery.report is not None and isinstance(effect, Activate):
        delivery.report(
            ActivationOutcome(attachment_generation=effect.attachment_generation, delivered=False)
        )
    if delivery.reply is None:
        return False
    if isinstance(delivery.reply, NoWaiter):
        # Nobody waits; the events were accepted (journaled ones replay), so
        # the NoWaiter hears the call's own answer (it may hold slots to free
        # and refusals to report), and the outbox reports the transport's failure.
        delivery.reply.resolve(delivery.value)
        return False
    delivery.reply.fail(error)
    return True


def settle_dropped(delivery: Delivery, reason: str) -> None:
    """The outbox was retired before these frames went out: the attachment is
    gone. A journaled event stays accepted (and replayable); an activation
    that never reached the client is rolled back."""
    effect = delivery.effect
    if isinstance(effect, Activate):
        settle_failed(delivery, SessionFailedError(f"activation abandoned: attachment {reason}"))
    elif delivery.reply is not None:
        delivery.reply.resolve(delivery.value)
