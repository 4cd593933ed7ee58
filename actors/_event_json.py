"""An event's compact JSON: the payload checks, the encoders the journal
measures events with, and the decoder a replay reads them back with.

`normalize_payload` makes a payload a fresh plain dict; `encode_event` gives
the compact JSON bytes of a sequenced one, byte for byte ``json.dumps``'s
(what the journal's byte cap counts); `_loads` is ``json.loads`` for those
bytes. The journal (`actors._journal`) imports them by name.

Pure: no I/O, no threads, no event loop.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from actors._errors import InvalidPayloadError

__all__ = [
    "encode_event",
    "normalize_payload",
]

# Built once: json.dumps would build an encoder per call for these options.
_COMPACT = {"separators": (",", ":"), "ensure_ascii": False}
_STRICT_ENCODER = json.JSONEncoder(allow_nan=False, **_COMPACT)  # type: ignore[arg-type]
_LENIENT_ENCODER = json.JSONEncoder(allow_nan=True, **_COMPACT)  # type: ignore[arg-type]


def _tree_encoder(allow_nan: bool) -> Callable[[object, int], Sequence[str]] | None:
    """json's C encoder with the arguments ``JSONEncoder.encode`` gives it, but no
    circular-reference bookkeeping: only for payloads known to be trees, so it
    holds no state between calls and its bytes are ``encode``'s. ``None``
    without the C accelerator."""
    make = json.encoder.c_make_encoder  # type: ignore[attr-defined]
    if make is None:
        return None
    encoder = _LENIENT_ENCODER if allow_nan else _STRICT_ENCODER
    encoded: Callable[[object, int], Sequence[str]] = make(
        None,
        encoder.default,
        json.encoder.encode_basestring,
        None,
        ":",
        ",",
        False,
        False,
        allow_nan,
    )
    return encoded


_STRICT_TREE_ENCODER = _tree_encoder(allow_nan=False)
_LENIENT_TREE_ENCODER = _tree_encoder(allow_nan=True)


def _dumps(payload: Mapping[Any, object], *, allow_nan: bool, tree: bool = False) -> bytes:
    """Compact JSON bytes; ``tree``: no container appears twice in ``payload``
    (so no cycle either), and the encoder may skip looking for cycles."""
    fast = _LENIENT_TREE_ENCODER if allow_nan else _STRICT_TREE_ENCODER
    if tree and fast is not None:
        return "".join(fast(payload, 0)).encode("utf-8")
    encoder = _LENIENT_ENCODER if allow_nan else _STRICT_ENCODER
    return encoder.encode(payload).encode("utf-8")


# The C scanner of a decoder: json.loads without its bytes-encoding sniffing
# and whitespace matching (a replay decodes every event it sends).
_SCAN_ONCE: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _loads(encoded: bytes) -> Any:
    """``json.loads(encoded)`` for the compact JSON the journal wrote."""
    text = encoded.decode("utf-8")
    try:
        value, end = _SCAN_ONCE(text, 0)
    except StopIteration:
        end = -1
    if end != len(text):
        return json.loads(text)  # not ours: json's own error (or value)
    return value


_EXACT_SCALARS = frozenset({str, int, float, bool, type(None)})


def _inspect_json(value: object, *, strict: bool) -> tuple[bool, bool]:
    """Whether ``json.loads`` of ``value``'s encoding gives ``value`` back exactly,
    and whether ``value`` is a tree (no container in it twice, so no cycle).

    Not exact: a tuple (comes back a list), a non-str key (comes back a str),
    a subclass of a JSON type. Strict: a non-str key, or a mapping that is not
    a plain dict, is an `InvalidPayloadError`; json.dumps catches the
    other non-JSON types later (and a cycle, which is looked into once).
    """
    exact = True
    tree = True
    seen: set[int] = set()
    stack: list[object] = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind in _EXACT_SCALARS:
            continue
        if id(item) in seen:
            tree = False
            continue
        seen.add(id(item))
        if kind is dict or (kind is not list and isinstance(item, dict)):
            exact = exact and kind is dict
            for key, child in item.items():  # type: ignore[attr-defined]
                if type(key) is not str:
                    if strict and not isinstance(key, str):
                        raise InvalidPayloadError(
                            f"payload keys must be strings, got {type(key).__name__}"
                        )
                    exact = False
                if type(child) not in _EXACT_SCALARS:
                    stack.append(child)
        elif kind is list:
            stack.extend(item)  # type: ignore[arg-type]
        elif isinstance(item, list | tuple):
            exact = False
            stack.extend(item)
        elif isinstance(item, Mapping):
            if strict:
                raise InvalidPayloadError("nested mappings must be plain dicts to be JSON")
            exact = False
        else:
            exact = False
    return exact, tree


def normalize_payload(payload: object, *, strict: bool) -> dict[object, object]:
    """A fresh plain dict of ``payload``, or `InvalidPayloadError`.

    Strict: ``payload`` must be a mapping. Lenient: whatever ``dict()`` takes,
    as the seed did.
    """
    if type(payload) is dict:
        return dict(payload)  # the common case, without the ABC check
    if strict and not isinstance(payload, Mapping):
        raise InvalidPayloadError(f"payload must be a mapping, got {type(payload).__name__}")
    try:
        return dict(payload)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError) as exc:
        raise InvalidPayloadError(f"payload is not a mapping: {exc}") from None


def encode_event(sequenced: dict[object, object], *, strict: bool) -> bytes:
    """Compact JSON bytes of a sequenced payload, or `InvalidPayloadError`."""
    return _encode_checked(sequenced, strict=strict)[0]


def _encode_checked(sequenced: dict[object, object], *, strict: bool) -> tuple[bytes, bool]:
    """The bytes, and whether decoding them gives ``sequenced`` back exactly."""
    exact, tree = _inspect_json(sequenced, strict=strict)
    try:
        return _dumps(sequenced, allow_nan=not strict, tree=tree), exact
    except (TypeError, ValueError, RecursionError) as exc:
        # The message of json's own error names the offending type or value,
        # never more of the payload than that.
        raise InvalidPayloadError(f"payload is not JSON: {exc}") from None
