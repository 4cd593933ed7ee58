"""A session's event rules: journaling events (one or a batch) and acks
(handlers of `actors._state.SessionState`). Pure: no I/O, no threads."""

from __future__ import annotations

from typing import Any

from actors._commands import Acknowledge, Deliver, EventAccepted, SendEvent, SendEvents
from actors._errors import InvalidPayloadError, JournalOverflowError
from actors._journal import normalize_payload
from actors._state_core import StateCore

__all__ = ["EventRules"]


class EventRules(StateCore):
    """The event handlers of `actors._state.SessionState`."""

    def _on_send_event(self, command: SendEvent) -> Any:
        self._failpoint("send_event.enter")
        attachment = self._attachment
        if command.journal:
            entry, frame = self._journal.record_framed(command.payload)
            self._failpoint("send_event.recorded")
            if command.on_accepted is not None:
                self._effects.append(EventAccepted(callback=command.on_accepted))
            if attachment is not None:
                self._effects.append(
                    Deliver(
                        attachment_generation=attachment.generation,
                        frames=(frame,),
                        encoded=(entry.encoded,),
                    )
                )
            self._failpoint("send_event.effects")
            return entry
        plain = normalize_payload(command.payload, strict=self._config.strict)
        self._failpoint("send_event.recorded")
        if attachment is not None:
            self._effects.append(
                Deliver(
                    attachment_generation=attachment.generation,
                    frames=(plain,),  # type: ignore[arg-type]
                    on_delivered=command.on_accepted,
                )
            )
        self._failpoint("send_event.effects")
        return None

    def _on_send_events(self, command: SendEvents) -> Any:
        self._failpoint("send_event.enter")
        attachment = self._attachment
        if not command.atomic:
            reply, frames = self._record_each(command)
        elif command.journal:
            entries, frames = self._journal.record_many_framed(command.payloads)
            reply = entries
        else:
            frames = tuple(
                normalize_payload(p, strict=self._config.strict) for p in command.payloads
            )
            reply = (None,) * len(frames)
        self._failpoint("send_event.recorded")
        if attachment is not None and frames:
            self._effects.append(
                Deliver(attachment_generation=attachment.generation, frames=frames)
            )
        self._failpoint("send_event.effects")
        return reply

    def _record_each(self, command: SendEvents) -> tuple[Any, tuple[Any, ...]]:
        """Each payload on its own: its entry (or None) or the error refusing it."""
        results: list[object] = []
        frames: list[object] = []
        for payload in command.payloads:
            try:
                if command.journal:
                    entry, frame = self._journal.record_framed(payload)
                    results.append(entry)
                    frames.append(frame)
                else:
                    frames.append(normalize_payload(payload, strict=self._config.strict))
                    results.append(None)
            except (InvalidPayloadError, JournalOverflowError) as refused:
                results.append(refused)
        return tuple(results), tuple(frames)

    def _on_acknowledge(self, command: Acknowledge) -> int:
        self._failpoint("acknowledge.enter")
        removed = self._journal.acknowledge(command.sequence)
        self._failpoint("acknowledge.removed")
        return removed
