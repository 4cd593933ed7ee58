"""The README's architecture picture follows the folders (issue #24).

Every module of `actors` and `supervisor` (the gateway's own modules aside:
the picture sums them up in prose) is named in the README's architecture
block, under the folder that holds it; every module the block names exists
there.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Folders whose modules the picture lists one by one.
LISTED_FOLDERS = ("actors", "supervisor", "supervisor/doors", "supervisor/stores", "supervisor/cli")


def _architecture_block() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("\n## Architecture\n", 1)[1]
    return section.split("```\n", 2)[1].splitlines()


def _named_by_folder(lines: list[str]) -> dict[str, set[str]]:
    """Folder -> the ``*.py`` names its entries start with, by indentation."""
    named: dict[str, set[str]] = {}
    stack: list[tuple[int, str]] = []
    for line in lines:
        indent = len(line) - len(line.lstrip(" "))
        # An entry's names come before the description, at least two spaces apart.
        head = re.split(r" {2,}", line.strip(), maxsplit=1)[0]
        if not head or indent >= 24:
            continue  # a description's continuation line
        while stack and stack[-1][0] >= indent:
            stack.pop()
        if head.endswith("/") and " " not in head:
            parent = stack[-1][1] + "/" if stack else ""
            stack.append((indent, parent + head.rstrip("/")))
            named.setdefault(stack[-1][1], set())
            continue
        if stack:
            names = {word for word in head.split() if word.endswith(".py")}
            named.setdefault(stack[-1][1], set()).update(names)
    return named


def test_the_architecture_block_names_every_module_under_its_folder() -> None:
    named = _named_by_folder(_architecture_block())
    for folder in LISTED_FOLDERS:
        present = {p.name for p in (ROOT / folder).glob("*.py") if p.name != "__init__.py"}
        listed = named.get(folder, set())
        assert sorted(present - listed) == [], f"{folder}/ holds modules the README does not name"
        assert sorted(listed - present) == [], f"the README names modules {folder}/ does not hold"


def test_the_check_sees_a_module_in_the_wrong_folder() -> None:
    # The parser must tell folders apart, or the check above could not fail.
    lines = [
        "actors/   the session",
        "  _state.py   rules",
        "supervisor/   the rest",
        "  _a.py   x",
        "  doors/   the doors",
        "    _trio.py   trio's",
        "  _b.py   back at the top",
    ]
    assert _named_by_folder(lines) == {
        "actors": {"_state.py"},
        "supervisor": {"_a.py", "_b.py"},
        "supervisor/doors": {"_trio.py"},
    }
