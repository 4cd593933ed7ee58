"""docs/guarantees.md cites only tests that exist, and states no count that can go stale."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUARANTEES = ROOT / "docs" / "guarantees.md"
TESTS = ROOT / "tests"

CITATION = re.compile(r"`(test_\w+\.py)(?:::(\w+))?`")


def _citations(text: str) -> list[tuple[str, str | None]]:
    return [(file, name or None) for file, name in CITATION.findall(text)]


def _defined(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    } | {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _missing(text: str) -> list[str]:
    missing = []
    for file, name in _citations(text):
        path = TESTS / file
        if not path.exists():
            missing.append(file)
        elif name is not None and name not in _defined(path):
            missing.append(f"{file}::{name}")
    return missing


def test_every_cited_test_exists() -> None:
    text = GUARANTEES.read_text(encoding="utf-8")
    assert len(_citations(text)) > 20
    assert _missing(text) == []


#: "599 tests", and "the attack tests (38, ...)".
STALE_COUNT = re.compile(r"\b\d[\d,]*\s+tests\b|\btests\s*\(\d")


def test_no_test_count_that_can_go_stale() -> None:
    text = GUARANTEES.read_text(encoding="utf-8")
    assert STALE_COUNT.findall(text) == []


@pytest.mark.parametrize(
    "line",
    [
        "`test_journal.py::test_no_such_test`",
        "`test_no_such_file.py`",
        "`test_no_such_file.py::test_x`",
    ],
)
def test_the_check_sees_a_stale_citation(line: str) -> None:
    assert _missing(line) != []


@pytest.mark.parametrize(
    "line", ["the whole suite (599 tests, 175 s)", "the attack tests (38, all against servers)"]
)
def test_the_check_sees_a_stale_count(line: str) -> None:
    assert STALE_COUNT.findall(line) != []
