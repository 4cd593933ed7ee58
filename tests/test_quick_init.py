"""`quick_init`: the same frozen dataclass, made by a cheaper ``__init__``."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass, field

import pytest

from actors._commands import Deliver, SendEvent
from actors._ports import Delivery
from actors._quick_init import quick_init
from actors._supervisor_mail import Call, Mail
from actors._transition import Transition


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plain:
    a: int
    b: tuple[int, ...] = ()
    c: object = field(default=None, repr=False, compare=False)


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class _Quick:
    a: int
    b: tuple[int, ...] = ()
    c: object = field(default=None, repr=False, compare=False)


@quick_init
@dataclass(frozen=True, slots=True, kw_only=True)
class _Inherited(Mail):
    a: int


def test_the_init_keeps_the_dataclass_signature_and_defaults() -> None:
    assert inspect.signature(_Quick) == inspect.signature(_Plain)
    made = _Quick(a=1)
    assert (made.a, made.b, made.c) == (1, (), None)
    assert repr(made) == "_Quick(a=1, b=())"
    assert made == _Quick(a=1, b=(), c="not compared")
    assert hash(made) == hash(_Quick(a=1))
    assert _Inherited(a=2).a == 2


def test_arguments_are_keyword_only_and_required_ones_required() -> None:
    with pytest.raises(TypeError):
        _Quick(1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        _Quick(a=1, d=2)  # type: ignore[call-arg]


def test_the_class_stays_frozen() -> None:
    made = _Quick(a=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        made.a = 2  # type: ignore[misc]
    assert dataclasses.replace(made, a=3) == _Quick(a=3)


def test_classes_it_does_not_fit_are_refused() -> None:
    @dataclass(slots=True, kw_only=True)
    class NotFrozen:
        a: int

    @dataclass(frozen=True, slots=True)
    class Positional:
        a: int

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Factory:
        a: list[int] = field(default_factory=list)

    @dataclass(frozen=True, slots=True, kw_only=True)
    class PostInit:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True, kw_only=True)
    class NoSlots:
        a: int

    @dataclass(frozen=True, slots=True, kw_only=True)
    class WithInitVar:
        a: int
        b: dataclasses.InitVar[int] = 0

    for cls in (NotFrozen, Positional, Factory, PostInit, NoSlots, WithInitVar):
        with pytest.raises(TypeError):
            quick_init(cls)


@pytest.mark.parametrize("cls", [Call, SendEvent, Transition, Deliver, Delivery])
def test_the_messages_made_once_per_event_use_it(cls: type) -> None:
    assert "_set_" in " ".join(cls.__init__.__code__.co_names)  # type: ignore[misc]
    assert dataclasses.is_dataclass(cls)
    assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]
