"""`quick_init`: a cheaper ``__init__`` for the frozen dataclasses made once per event.

A frozen dataclass's generated ``__init__`` sets each field through
``object.__setattr__``, which looks the attribute up on the type again for
every field: a four-field message took ~2.5x as long to make as the same
class's slots set through their own descriptors. Five such objects are made
per awaited send (the command, its ``Call``, the ``Transition``, the
``Deliver`` effect and its ``Delivery``), so the difference was a measured
share of every event.

The class stays what the house rules ask of a message: a frozen, slotted,
keyword-only dataclass, equal, hashed and shown as before, whose fields
cannot be set after ``__init__``. Only the ``__init__`` is replaced, by one
with the same keyword-only signature and defaults.
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

__all__ = ["quick_init"]

_T = TypeVar("_T")


def quick_init(cls: type[_T]) -> type[_T]:
    """Replace a frozen, slotted, keyword-only dataclass's ``__init__`` with one
    that sets each slot through its member descriptor.

    Raises ``TypeError`` for a class this does not fit: not such a dataclass,
    a field left out of ``__init__``, a ``default_factory``, a
    ``__post_init__`` (which the replaced ``__init__`` would not call), or
    anything else that would make the two ``__init__`` signatures differ.
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    if hasattr(cls, "__post_init__"):
        raise TypeError(f"{cls.__name__} has a __post_init__")
    scope: dict[str, Any] = {}
    arguments: list[str] = []
    body: list[str] = []
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        if not field.init or not field.kw_only:
            raise TypeError(f"{cls.__name__}.{field.name} is not a keyword-only init field")
        if field.default_factory is not dataclasses.MISSING:
            raise TypeError(f"{cls.__name__}.{field.name} has a default_factory")
        name = field.name
        # The descriptor may live on a base class (an inherited slot).
        scope[f"_set_{name}"] = _member(cls, name).__set__
        if field.default is dataclasses.MISSING:
            arguments.append(name)
        else:
            scope[f"_default_{name}"] = field.default
            arguments.append(f"{name}=_default_{name}")
        body.append(f"    _set_{name}(self, {name})")
    signature = f"self, *, {', '.join(arguments)}" if arguments else "self"
    source = f"def __init__({signature}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, scope)  # noqa: S102 - code built from field names only, as dataclasses does
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(cls.__init__.__annotations__)
    # Whatever the checks above missed (an InitVar, say) shows as another signature.
    if inspect.signature(init) != inspect.signature(cls.__init__):
        raise TypeError(f"{cls.__name__}: the quick __init__ would not take what its own takes")
    type.__setattr__(cls, "__init__", init)
    return cls


def _member(cls: type, name: str) -> Any:
    for klass in cls.__mro__:
        if name in klass.__dict__:
            return klass.__dict__[name]
    raise TypeError(f"{cls.__name__} has no slot {name!r}")  # pragma: no cover - fields are slots
