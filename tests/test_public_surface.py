"""The public surface is listed in one place, docs/api.md, and nowhere wider."""

from __future__ import annotations
import __future__

import ast
import dataclasses
import importlib
import inspect
import re
import types
import typing
from pathlib import Path

import pytest

API = Path(__file__).resolve().parent.parent / "docs" / "api.md"
PACKAGES = ("supervisor", "actors", "supervisor.gateway")
#: Public modules with a surface of their own (``__all__``) listed like a package's.
LISTED_MODULES = ("supervisor.client",)
#: Folders that only show the architecture: every module in them is internal.
INTERNAL_FOLDERS = ("supervisor.doors", "supervisor.stores", "supervisor.cli")


def _listed(package: str) -> set[str]:
    """The names the surface section lists for ``package``."""
    text = API.read_text(encoding="utf-8")
    surface = text.split("## The surface, in one place", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"^`{re.escape(package)}`[^\n]*:\n(.*?)(?:\n\n|\Z)", surface, re.M | re.S)
    assert match is not None, f"docs/api.md lists no surface for {package}"
    return set(re.findall(r"`(\w+)`", match.group(1)))


def _rendered() -> set[str]:
    """The objects the API reference renders from their docstrings."""
    return set(re.findall(r"^::: ([\w.]+)$", API.read_text(encoding="utf-8"), re.M))


@pytest.mark.parametrize("package", PACKAGES + LISTED_MODULES)
def test_every_exported_name_is_listed_and_every_listed_name_exported(package: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == _listed(package)


@pytest.mark.parametrize("package", PACKAGES)
def test_a_package_has_no_public_name_outside_its_all(package: str) -> None:
    module = importlib.import_module(package)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType | __future__._Feature)
    }
    assert public <= set(module.__all__)


@pytest.mark.parametrize("package", PACKAGES + LISTED_MODULES)
def test_every_listed_name_is_rendered_in_the_reference(package: str) -> None:
    rendered = _rendered()
    for name in _listed(package):
        if package == "actors" and name in _listed("supervisor"):
            continue  # rendered once, under supervisor
        assert f"{package}.{name}" in rendered, f"{package}.{name}"


def test_the_trio_door_is_supervisor_open_session_registry() -> None:
    import supervisor
    from supervisor.doors._trio import open_session_registry

    assert supervisor.open_session_registry is open_session_registry


def test_the_test_fails_on_an_unlisted_export(monkeypatch: pytest.MonkeyPatch) -> None:
    import supervisor

    monkeypatch.setattr(supervisor, "__all__", [*supervisor.__all__, "SessionSystem"])
    with pytest.raises(AssertionError):
        test_every_exported_name_is_listed_and_every_listed_name_exported("supervisor")


def _documented(obj: object) -> bool:
    doc = (getattr(obj, "__doc__", None) or "").strip()
    if inspect.isclass(obj) and dataclasses.is_dataclass(obj):
        # dataclass() writes "Name(field: type, ...)" into a class without a
        # docstring: that is no docstring.
        return bool(doc) and not doc.startswith(f"{obj.__name__}(")
    return bool(doc)


def _members(cls: type) -> list[tuple[str, object]]:
    """A class's public methods, properties, class and static methods."""
    members: list[tuple[str, object]] = []
    for attribute, member in vars(cls).items():
        if attribute.startswith("_"):
            continue
        if isinstance(member, property):
            members.append((attribute, member.fget))
        elif isinstance(member, classmethod | staticmethod):
            members.append((attribute, member.__func__))
        elif callable(member):
            members.append((attribute, member))
    return members


#: Every package or public module whose ``__all__`` is the user's surface
#: (the gateway's is checked where the gateway is).
DOCUMENTED = (
    "supervisor",
    "actors",
    "supervisor.compat",
    "supervisor.testing",
    "supervisor.client",
)


@pytest.mark.parametrize("package", DOCUMENTED)
def test_every_public_name_and_method_has_a_docstring(package: str) -> None:
    module = importlib.import_module(package)
    missing: list[str] = []
    for name in module.__all__:
        value = getattr(module, name)
        if typing.get_origin(value) is not None or not (
            inspect.isclass(value) or inspect.isfunction(value)
        ):
            continue  # a type alias: see the next test
        if not _documented(value):
            missing.append(name)
        if inspect.isclass(value):
            missing += [
                f"{name}.{attribute}"
                for attribute, member in _members(value)
                if not _documented(member)
            ]
    assert missing == []


def _alias_docstrings(package: str) -> dict[str, bool]:
    """Each module-level assignment of the package: whether a string follows it.

    That string is the alias's docstring for the API reference (mkdocstrings
    reads it; a ``#:`` comment it does not).
    """
    folder = Path(importlib.import_module(package).__file__ or "").parent
    found: dict[str, bool] = {}
    for path in folder.rglob("*.py"):
        body = ast.parse(path.read_text(encoding="utf-8")).body
        for statement, following in zip(body, [*body[1:], None], strict=True):
            targets = (
                statement.targets
                if isinstance(statement, ast.Assign)
                else [statement.target]
                if isinstance(statement, ast.AnnAssign)
                else []
            )
            documented = (
                isinstance(following, ast.Expr)
                and isinstance(following.value, ast.Constant)
                and isinstance(following.value.value, str)
            )
            for target in targets:
                if isinstance(target, ast.Name):
                    found[target.id] = found.get(target.id, False) or documented
    return found


@pytest.mark.parametrize("package", ["supervisor", "actors"])
def test_every_exported_type_alias_has_a_docstring(package: str) -> None:
    module = importlib.import_module(package)
    aliases = [
        name
        for name in module.__all__
        if not (inspect.isclass(getattr(module, name)) or inspect.isfunction(getattr(module, name)))
    ]
    assert aliases  # the test can see them
    docstrings = _alias_docstrings(package)
    assert [name for name in aliases if not docstrings.get(name)] == []


PUBLIC_MODULES = {
    "supervisor.client",
    "supervisor.compat",
    "supervisor.testing",
    "supervisor.redis_store",
    "supervisor.gateway.asgi",
    "supervisor.messages",
    "supervisor.engine_bus",
    "supervisor.worker",
}


def test_every_implementation_module_is_private() -> None:
    """A module is public only if docs/api.md names it; the rest start with ``_``."""
    root = Path(__file__).resolve().parent.parent
    named = set(re.findall(r"`(supervisor(?:\.\w+)+)`", API.read_text(encoding="utf-8")))
    for package in PACKAGES + INTERNAL_FOLDERS:
        folder = root.joinpath(*package.split("."))
        for path in folder.glob("*.py"):
            dotted = f"{package}.{path.stem}"
            if path.stem.startswith("_"):
                continue
            assert dotted in PUBLIC_MODULES, f"{dotted} is public but not one of the documented"
            assert dotted in named, f"{dotted} is not named in docs/api.md"
