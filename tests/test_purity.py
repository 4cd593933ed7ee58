"""The pure core imports no pykka, trio, asyncio or threading, not even transitively.

Imports are read with ``ast`` (nothing is executed) and followed through the
``actors`` package: ``import actors.x``, ``from actors.x import y``, ``from
actors import x`` (the submodule ``x``, or the package ``__init__`` when ``x``
is not a submodule) and relative imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import actors

PACKAGE_DIR = Path(actors.__file__).parent
PURE_MODULES = (
    "_state",
    "_transition",
    "_journal",
    "_event_json",
    "_credential",
    "_commands",
    "_lifecycle",
    "_counters",
    "_store",
    "_store_binding",
    "_supervisor_machine",
    "_client_seqs",
    "_state_core",
    "_resume_rules",
    "_event_rules",
    "_attachment_rules",
    "_fields",
    "_errors",
    "_ownership",
)
FORBIDDEN = frozenset({"pykka", "trio", "asyncio", "threading"})
DYNAMIC_IMPORTERS = frozenset({"import_module", "__import__"})


def _package_module(dotted: str) -> str | None:
    """``actors._x.y`` -> ``_x`` when it names a module file of the package."""
    parts = dotted.split(".")
    if parts[0] != "actors":
        return None
    if len(parts) == 1:
        return "__init__"
    return parts[1] if (PACKAGE_DIR / f"{parts[1]}.py").exists() else "__init__"


def imports_of(source: str) -> tuple[set[str], set[str]]:
    """(top-level external packages, modules of ``actors``) that ``source`` imports."""
    external: set[str] = set()
    internal: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = _package_module(alias.name)
                (internal if local else external).add(local or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            base = "actors" if node.level else (node.module or "")
            if node.level and node.module:
                base = f"actors.{node.module}"
            if _package_module(base) is None:
                external.add(base.split(".")[0])
                continue
            if base == "actors":
                for alias in node.names:
                    internal.add(_package_module(f"actors.{alias.name}") or "__init__")
            else:
                internal.add(_package_module(base) or "__init__")
        elif isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in DYNAMIC_IMPORTERS:
                external.add(f"<dynamic import via {name}>")
    return external, internal


def closure(start: str) -> dict[str, set[str]]:
    """Every ``actors`` module ``start`` reaches, with its external imports."""
    seen: dict[str, set[str]] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        external, internal = imports_of((PACKAGE_DIR / f"{name}.py").read_text("utf-8"))
        seen[name] = external
        todo.extend(internal - seen.keys())
    return seen


@pytest.mark.parametrize("module", PURE_MODULES)
def test_pure_module_imports_no_concurrency_runtime_even_transitively(module: str) -> None:
    reached = closure(module)
    offenders = {
        name: sorted(
            imported
            for imported in external
            if imported in FORBIDDEN or imported.startswith("<dynamic")
        )
        for name, external in reached.items()
    }
    assert {name: bad for name, bad in offenders.items() if bad} == {}


def test_pure_modules_never_reach_the_actor_or_supervisor_layers() -> None:
    for module in PURE_MODULES:
        reached = closure(module)
        assert "_session" not in reached and "_ports" not in reached, module
        assert all("supervisor" not in external for external in reached.values()), module


def test_closure_follows_the_core_through_the_package() -> None:
    assert {"_journal", "_errors", "_credential", "_commands", "_transition"} <= set(
        closure("_state")
    )
    assert {"_journal", "_credential"} <= set(closure("_commands"))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import trio", {"trio"}),
        ("import asyncio.events", {"asyncio"}),
        ("from threading import Lock", {"threading"}),
        ("from pykka import ThreadingActor", {"pykka"}),
        ("import importlib\nimportlib.import_module('trio')", {"importlib", "<dynamic"}),
        ("__import__('trio')", {"<dynamic"}),
    ],
)
def test_the_checker_sees_forbidden_imports(source: str, expected: set[str]) -> None:
    external, _ = imports_of(source)
    found = {name if not name.startswith("<dynamic") else "<dynamic" for name in external}
    assert found == expected


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from actors._journal import EventJournal", {"_journal"}),
        ("import actors._state", {"_state"}),
        ("from actors import _commands, _errors", {"_commands", "_errors"}),
        ("from actors import logger", {"__init__"}),
        ("from . import _journal", {"_journal"}),
        ("from ._credential import ResumeToken", {"_credential"}),
    ],
)
def test_the_checker_follows_package_imports(source: str, expected: set[str]) -> None:
    external, internal = imports_of(source)
    assert internal == expected
    assert external == set()
