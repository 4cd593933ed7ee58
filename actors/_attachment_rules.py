"""A session's attachment rules: releasing the attachment, asking about it, the
tick (journal TTL, a detached session's expiry) and the close (handlers of
`actors._state.SessionState`). Pure: no I/O, no threads."""

from __future__ import annotations

from actors._commands import (
    Close,
    DetachedAttachment,
    HasAttachment,
    IsCurrentAttachment,
    Notify,
    ReleaseAttachment,
    RetireAttachment,
    Tick,
    TickResult,
    TransportAttachment,
)
from actors._state_core import StateCore
from actors._transition import check_generation

__all__ = ["AttachmentRules"]


class AttachmentRules(StateCore):
    """The attachment handlers of `actors._state.SessionState`."""

    def _on_release_attachment(self, command: ReleaseAttachment) -> DetachedAttachment | None:
        self._failpoint("release_attachment.enter")
        wanted = command.attachment_generation
        if self._config.strict:
            check_generation(wanted, what="attachment_generation", optional=True)
        if self._attachment is None:
            return None
        if wanted is not None and wanted != self._fields.attachment_generation:
            return None
        self._detach("detached")
        self._failpoint("release_attachment.detached")
        self._effects.append(Notify(event=self._event("detached")))
        return DetachedAttachment(
            session_id=self._session_id,
            attachment_generation=self._fields.attachment_generation,
            lease_generation=self._fields.lease_generation,
        )

    def _on_has_attachment(self, command: HasAttachment) -> bool:
        self._failpoint("has_attachment.enter")
        return self._attachment is not None

    def _on_is_current_attachment(self, command: IsCurrentAttachment) -> bool:
        self._failpoint("is_current_attachment.enter")
        return (
            self._attachment is not None
            and self._fields.attachment_generation == command.attachment_generation
        )

    def _on_tick(self, command: Tick) -> TickResult:
        self._failpoint("tick.enter")
        pruned = self._journal.prune(command.now)
        self._failpoint("tick.pruned")
        grace = self._config.disconnect_grace_s
        detached_at = self._fields.detached_at
        expired = (
            grace is not None
            and detached_at is not None
            and self._pending_resumes == 0
            and not self._activations
            and command.now - detached_at >= grace
        )
        return TickResult(pruned=pruned, expired=expired)

    def _on_close(self, command: Close) -> TransportAttachment | None:
        self._failpoint("close.enter")
        attachment = self._attachment
        if attachment is not None:
            self._effects.append(
                RetireAttachment(attachment_generation=attachment.generation, reason="closed")
            )
        self._closed = True
        self._failpoint("close.closed")
        self._effects.append(Notify(event=self._event("closed")))
        return attachment
