"""The calls a gateway makes around a resume and an engine lease, beyond the seed.

Part of `supervisor.doors._door.AsyncSessionRegistry`'s surface (the
README's *Engine leases*): the claim an activation holds while the engine's
lease moves (``begin_resume``/``end_resume``), who owns a lease generation
(``settle_lease_generation``, ``release_attachment``), which connection is
attached (``has_attachment``, ``is_current_attachment``) and undoing a
resume the client may never have seen (``abandon_resume``).
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from actors._commands import (
    AbortResume,
    BeginResume,
    DetachedAttachment,
    EndResume,
    HasAttachment,
    IsCurrentAttachment,
    ReleaseAttachment,
    SettleLeaseGeneration,
)
from supervisor._validate import check_generation, check_session_id
from supervisor.doors._door_loop import LoopDoor

__all__ = ["EngineLeaseCalls"]


class EngineLeaseCalls(LoopDoor):
    """A door's engine-lease calls; see the module docstring."""

    async def release_attachment(
        self, session_id: str, *, attachment_generation: int | None = None
    ) -> DetachedAttachment | None:
        """``detach`` that also hands back the lease generation the dropped connection served.

        Returns:
            DetachedAttachment | None: the dropped attachment's generation
            and engine lease generation; ``None`` where ``detach`` answers
            ``False``. Fence the engine's own detach on that lease.
        """
        released: DetachedAttachment | None = await self._release(session_id, attachment_generation)
        return released

    def _release(self, session_id: str, attachment_generation: int | None) -> Awaitable[Any]:
        """Send ``ReleaseAttachment`` and return what to await: ``detach``
        awaits it itself (not a coroutine: one fewer per detach)."""
        check_session_id(session_id, strict=self._strict)
        check_generation(
            attachment_generation, what="attachment_generation", optional=True, strict=self._strict
        )
        return self._ask(session_id, ReleaseAttachment(attachment_generation=attachment_generation))

    async def begin_resume(self, session_id: str) -> None:
        """Claim that a resume of ``session_id`` is about to land and activate.

        Hold the claim from before the engine's lease resume until
        ``end_resume``. While any claim is open, a lease generation that
        loses its owner is parked for the next activation instead of going
        to the connection that activation is about to replace.

        Raises:
            UnknownSessionError: no such session.
        """
        check_session_id(session_id, strict=self._strict)
        await self._ask(session_id, BeginResume())

    async def end_resume(self, session_id: str) -> int | None:
        """Release a ``begin_resume`` claim, whether or not the resume activated.

        Returns:
            int | None: a lease generation the caller must detach itself (it
            was parked for an activation that never came and nobody is
            attached to take it over); ``None`` when nothing is owed or the
            session is unknown.
        """
        check_session_id(session_id, strict=self._strict)
        owed: int | None = await self._ask(session_id, EndResume())
        return owed

    async def settle_lease_generation(self, session_id: str, lease_generation: int) -> int | None:
        """Find an owner for the lease generation of a resume whose connection never served.

        The engine already moved its lease to ``lease_generation``. The
        owner is, in order: the resume waiting to activate (it absorbs the
        generation when it activates); else the attached connection (its
        own detach must be able to detach this lease); else nobody, and the
        generation is returned for the caller to put back into disconnect
        grace. Generations only move forward.

        Returns:
            int | None: the generation nobody owns, or ``None`` (owned, or
            the session is unknown).
        """
        check_session_id(session_id, strict=self._strict)
        check_generation(
            lease_generation, what="lease_generation", optional=False, strict=self._strict
        )
        command = SettleLeaseGeneration(lease_generation=lease_generation)
        owed: int | None = await self._ask(session_id, command)
        return owed

    async def has_attachment(self, session_id: str) -> bool:
        """Whether some connection is attached now (``False`` for an unknown session).

        For a resume that failed to activate: it has no generation of its
        own, and must know whether rolling the lease back would roll back
        somebody else's live attachment.
        """
        check_session_id(session_id, strict=self._strict)
        return bool(await self._ask(session_id, HasAttachment()))

    async def is_current_attachment(self, session_id: str, attachment_generation: int) -> bool:
        """Whether ``attachment_generation`` is attached now (``False`` if unknown)."""
        check_session_id(session_id, strict=self._strict)
        check_generation(
            attachment_generation, what="attachment_generation", optional=False, strict=self._strict
        )
        command = IsCurrentAttachment(attachment_generation=attachment_generation)
        return bool(await self._ask(session_id, command))

    async def abandon_resume(self, session_id: str, *, attachment_generation: int) -> bool:
        """Roll back a resume the client may never have seen the answer to.

        For a transport that can lose the activation after ``send`` returned
        (a link that dropped before the client read it): if the resume of
        ``attachment_generation`` is still the current one, it is undone as a
        failed activation would be: detached, the presented token usable
        once more, the rotated token still valid.

        Returns:
            bool: whether it was rolled back (``False``: not the current one).

        Raises:
            UnknownSessionError: no such session.
        """
        check_session_id(session_id, strict=self._strict)
        check_generation(
            attachment_generation, what="attachment_generation", optional=False, strict=self._strict
        )
        command = AbortResume(attachment_generation=attachment_generation)
        return bool(await self._ask(session_id, command))
