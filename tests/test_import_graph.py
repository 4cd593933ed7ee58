"""No import cycle among the modules of ``actors`` and ``supervisor``; ``actors``
never imports ``supervisor``.

Imports are read with ``ast`` (nothing is executed), and every import
statement counts wherever it stands: at module level, inside a function,
and under ``if TYPE_CHECKING:`` (a cycle that only the type checker sees is
still two modules that cannot be understood, or moved, one without the
other). ``from pkg import name`` is an edge to the submodule ``pkg.name``
when there is one, else to the package ``pkg`` (its ``__init__``). The
package ``__init__`` that Python runs before any of its submodules is not
an edge: ``supervisor/__init__.py`` re-exports from its modules, and that
would make every module a cycle with it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest

import actors
import supervisor

PACKAGES = {"actors": Path(actors.__file__).parent, "supervisor": Path(supervisor.__file__).parent}


def modules() -> dict[str, Path]:
    """Every module of the two packages, by dotted name (a package by its own name)."""
    found: dict[str, Path] = {}
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(name: str, source: str, known: Mapping[str, object], *, package: bool) -> set[str]:
    """The modules of ``known`` that module ``name`` imports anywhere in ``source``."""
    edges: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                # ``import a.b.c`` imports a, a.b and a.b.c: the deepest known one.
                parts = alias.name.split(".")
                for end in range(len(parts), 0, -1):
                    if ".".join(parts[:end]) in known:
                        edges.add(".".join(parts[:end]))
                        break
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, *([node.module] if node.module else [])])
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                if submodule in known:
                    edges.add(submodule)
                elif base in known:
                    edges.add(base)
    edges.discard(name)
    return edges


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {
        name: imports_of(name, path.read_text("utf-8"), known, package=path.name == "__init__.py")
        for name, path in known.items()
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected group of modules, as a path ``a, b, ..., a``."""
    found: list[list[str]] = []
    for group in _strongly_connected(graph):
        if len(group) > 1:
            found.append(_cycle_through(min(group), graph, group))
    return sorted(found)


def _strongly_connected(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative (no recursion limit to meet)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            for successor in successors:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(graph.get(successor, ())))))
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index[successor])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group: set[str] = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    groups.append(group)
    return groups


def _cycle_through(start: str, graph: Mapping[str, set[str]], group: set[str]) -> list[str]:
    """The shortest path from ``start`` back to itself inside ``group`` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for successor in sorted(graph[node] & group):
                if successor == start:
                    chain = [node]
                    while chain[-1] != start:
                        chain.append(came_from[chain[-1]])
                    return [*reversed(chain), start]
                if successor not in came_from:
                    came_from[successor] = node
                    following.append(successor)
        frontier = following
    raise AssertionError(f"{start} is in a cycle that does not come back to it")


def test_no_import_cycle_among_the_library_modules() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in found)


def test_actors_never_imports_supervisor() -> None:
    graph = import_graph()
    offenders = {
        (name, imported)
        for name, imported_names in graph.items()
        if name.split(".")[0] == "actors"
        for imported in imported_names
        if imported.split(".")[0] == "supervisor"
    }
    assert offenders == set()


def test_the_graph_knows_both_packages_and_the_gateway() -> None:
    graph = import_graph()
    assert {"actors", "actors._session", "supervisor", "supervisor.gateway._service"} <= set(graph)
    assert "supervisor._system" in graph["supervisor.doors._door"]


KNOWN = dict.fromkeys(["pkg", "pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"])


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import pkg.b", {"pkg.b"}),
        ("import pkg.b.missing", {"pkg.b"}),
        ("from pkg.b import thing", {"pkg.b"}),
        ("from pkg import b, thing", {"pkg.b", "pkg"}),
        ("from . import b", {"pkg.b"}),
        ("from .sub.c import thing", {"pkg.sub.c"}),
        ("from .sub import c", {"pkg.sub.c"}),
        ("def f():\n    from pkg.b import thing", {"pkg.b"}),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.b", {"pkg.b"}),
        ("import os\nfrom collections import abc", set()),
    ],
)
def test_every_import_statement_is_an_edge(source: str, expected: set[str]) -> None:
    assert imports_of("pkg.a", source, KNOWN, package=False) == expected


def test_relative_imports_of_a_package_start_at_the_package() -> None:
    assert imports_of("pkg.sub", "from . import c\nfrom .. import a", KNOWN, package=True) == {
        "pkg.sub.c",
        "pkg.a",
    }


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, []),
        ({"a": {"b"}, "b": {"a"}}, [["a", "b", "a"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}, [["a", "b", "c", "a"]]),
        (
            {"a": {"b"}, "b": {"a"}, "x": {"y"}, "y": {"z"}, "z": {"x"}},
            [["a", "b", "a"], ["x", "y", "z", "x"]],
        ),
        ({"a": {"b", "c"}, "b": {"c"}, "c": {"b"}}, [["b", "c", "b"]]),
    ],
)
def test_cycles_are_found_and_named(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected
