"""A session's resume rules: tokens, resumes, their activations and rollbacks,
and the lease generations they settle (handlers of `actors._state.SessionState`).

The seed's resume flow: `begin_resume` claims, `authenticate_resume` checks
the token and the sequence before anything changes, `resume` rotates the
token and attaches the new transport (its activation on the wire until its
`ActivationOutcome`), a failed activation or an `AbortResume` rolls back (the
presented token works again, once; the lease it served is parked as the
orphan), and `end_resume` / `settle_lease_generation` hand an orphaned lease
back once no resume will absorb it. Pure: no I/O, no threads.
"""

from __future__ import annotations

import hmac
from dataclasses import replace

from actors._commands import (
    AbortResume,
    Activate,
    ActivationOutcome,
    AuthenticateResume,
    BeginResume,
    EndResume,
    Notify,
    Resume,
    ResumeResult,
    RetireAttachment,
    SettleLeaseGeneration,
    TransportAttachment,
)
from actors._credential import ResumeToken, token_digest
from actors._errors import InvalidInputError, InvalidResumeTokenError
from actors._state_core import StateCore
from actors._transition import check_generation

__all__ = ["ResumeRules"]


class ResumeRules(StateCore):
    """The resume handlers of `actors._state.SessionState`."""

    def _check_token(self, token: object) -> str:
        if not isinstance(token, str):
            raise InvalidInputError(f"resume token must be a str, got {type(token).__name__}")
        return token

    def _validate_resume_identity(self, token: str) -> bool:
        """``False``: the current token. ``True``: the one-shot recovery token."""
        digest = token_digest(token)
        if hmac.compare_digest(self._fields.token_digest, digest):
            return False
        recovery = self._fields.recovery_token_digest
        if (
            self._attachment is None
            and recovery is not None
            and hmac.compare_digest(recovery, digest)
        ):
            return True
        raise InvalidResumeTokenError(f"invalid resume token for duplex session {self._session_id}")

    def _settle_orphan(self) -> int | None:
        fields = self._fields
        orphan = fields.orphaned_lease_generation
        if orphan is None or self._pending_resumes > 0:
            # Nothing parked, or the next activation absorbs it (see resume).
            return None
        if self._attachment is not None:
            lease = max(fields.lease_generation, orphan)
            self._fields = replace(fields, orphaned_lease_generation=None, lease_generation=lease)
            return None
        self._fields = replace(fields, orphaned_lease_generation=None)
        return orphan

    def _on_begin_resume(self, command: BeginResume) -> None:
        self._failpoint("begin_resume.enter")
        self._pending_resumes += 1
        self._failpoint("begin_resume.claimed")

    def _on_end_resume(self, command: EndResume) -> int | None:
        self._failpoint("end_resume.enter")
        self._pending_resumes = max(0, self._pending_resumes - 1)
        owed = self._settle_orphan()
        self._failpoint("end_resume.released")
        return owed

    def _on_settle_lease_generation(self, command: SettleLeaseGeneration) -> int | None:
        self._failpoint("settle_lease_generation.enter")
        if self._config.strict:
            check_generation(command.lease_generation, what="lease_generation", optional=False)
        orphan = max(self._fields.orphaned_lease_generation or 0, command.lease_generation)
        self._fields = replace(self._fields, orphaned_lease_generation=orphan)
        self._failpoint("settle_lease_generation.parked")
        return self._settle_orphan()

    def _on_authenticate_resume(self, command: AuthenticateResume) -> None:
        self._failpoint("authenticate_resume.enter")
        token = self._check_token(command.resume_token)
        self._validate_resume_identity(token)
        self._failpoint("authenticate_resume.verified")
        self._journal.replay_after(command.last_received_server_event_seq)

    def _on_resume(self, command: Resume) -> ResumeResult:
        self._failpoint("resume.enter")
        token = self._check_token(command.resume_token)
        if self._config.strict:
            check_generation(command.lease_generation, what="lease_generation", optional=True)
        # Token before sequence: a stranger learns nothing about the journal.
        used_recovery = self._validate_resume_identity(token)
        replay = self._journal.replay_after(command.last_received_server_event_seq)
        self._failpoint("resume.verified")
        fields = self._fields
        accepted_digest = fields.token_digest
        if used_recovery and fields.recovery_token_digest is not None:
            accepted_digest = fields.recovery_token_digest
        rotated = ResumeToken.generate()
        self._fields = fields = replace(
            fields, recovery_token_digest=None, token_digest=token_digest(rotated.plaintext)
        )
        self._failpoint("resume.rotated")
        replaced = self._attachment
        if replaced is not None:
            self._effects.append(
                RetireAttachment(attachment_generation=replaced.generation, reason="replaced")
            )
        generation = fields.attachment_generation + 1
        self._attachment = TransportAttachment(
            generation=generation, send=command.send, close=command.close
        )
        self._fields = replace(
            fields,
            attachment_generation=generation,
            detached_at=None,
            # The activating connection serves the newest lease the engine holds:
            # its own resume's, or a newer one abandoned while this one was pending.
            lease_generation=max(
                fields.lease_generation,
                command.lease_generation if command.lease_generation is not None else 0,
                fields.orphaned_lease_generation or 0,
            ),
            orphaned_lease_generation=None,
            last_resume=(generation, accepted_digest),
        )
        self._failpoint("resume.attached")
        if command.activation_payload_factory is not None:
            self._activations[generation] = accepted_digest
            self._effects.append(
                Activate(
                    attachment_generation=generation,
                    resume_token=rotated,
                    payload_factory=command.activation_payload_factory,
                    replay=replay,
                )
            )
        self._effects.append(Notify(event=self._event("resumed")))
        return ResumeResult(
            session_id=self._session_id,
            attachment_generation=generation,
            resume_token=rotated,
            replay_entries=replay,
            replaced_attachment=replaced,
        )

    def _on_activation_outcome(self, command: ActivationOutcome) -> bool:
        """``True`` when this outcome rolled the resume back."""
        self._failpoint("activation_outcome.enter")
        generation = command.attachment_generation
        accepted_digest = self._activations.pop(generation, None)
        if accepted_digest is None or command.delivered:
            return False
        return self._roll_back(generation, accepted_digest, "activation_outcome.rolled_back")

    def _on_abort_resume(self, command: AbortResume) -> bool:
        """``True`` when the resume was rolled back; ``False``: nothing to undo."""
        self._failpoint("abort_resume.enter")
        generation = command.attachment_generation
        accepted_digest = self._activations.pop(generation, None)
        if accepted_digest is None:
            last = self._fields.last_resume
            if last is None or last[0] != generation:
                return False
            accepted_digest = last[1]
        return self._roll_back(generation, accepted_digest, "abort_resume.rolled_back")

    def _roll_back(self, generation: int, accepted_digest: bytes, failpoint: str) -> bool:
        # The seed's rollback, generation-checked: a later resume that took
        # over keeps its attachment. The presented token works again, once;
        # the lease the provisional attachment served is parked as the orphan.
        if self._fields.attachment_generation != generation:
            return False
        if self._attachment is not None:
            self._detach("activation_failed")
        fields = self._fields
        self._fields = replace(
            fields,
            recovery_token_digest=accepted_digest,
            orphaned_lease_generation=max(
                fields.orphaned_lease_generation or 0, fields.lease_generation
            ),
            last_resume=None,
        )
        self._failpoint(failpoint)
        return True
