"""The README's commands are what CI runs, and every example in the docs runs somewhere.

`.ci/run` runs the README's two commands (the main job and the test command)
exactly as the README writes them, before it installs the dev tools; these
tests fail when the two files drift apart. Every fenced block with a language
in README.md and docs/*.md says, in the HTML comment on the line before it,
either which file runs it as written (``<!-- runs: PATH -->``) or that it is
an excerpt (``<!-- fragment: why -->``).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"
DOCS = [README, *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)
MARKER = re.compile(r"<!-- (runs|fragment): ?(.*?) -->")


def _commands_under(heading: str) -> list[str]:
    section = README.read_text(encoding="utf-8").split(f"## {heading}\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    return [m.group(2).strip() for m in BLOCK.finditer(section) if m.group(1) == "sh"]


def _ci_lines() -> list[str]:
    return CI_RUN.read_text(encoding="utf-8").splitlines()


def _line_of(command: str) -> int:
    """Where ``.ci/run`` runs ``command`` (a line that starts with it, as written)."""
    found = [i for i, line in enumerate(_ci_lines()) if line.startswith(command)]
    assert found, f".ci/run does not run the README's command as written: {command!r}"
    return found[0]


def test_ci_runs_the_readmes_main_job_and_test_command_as_written() -> None:
    main_job = _commands_under("Watch it work")[0]
    test_command = _commands_under("Run the tests")[0]
    assert main_job == "pip install . && duplex-supervisor demo"
    assert test_command == "pip install -e '.[test]' && pytest"
    dev_install = next(i for i, line in enumerate(_ci_lines()) if "'.[dev]'" in line)
    # The test command runs with only what it installs: the dev tools come after.
    assert _line_of(main_job) < _line_of(test_command) < dev_install


def test_the_drift_check_fails_on_a_command_ci_does_not_run() -> None:
    with pytest.raises(AssertionError, match="does not run the README's command"):
        _line_of("pip install -e '.[tests]' && pytest")


def _blocks(path: Path) -> list[tuple[int, str, str, re.Match[str] | None]]:
    text = path.read_text(encoding="utf-8")
    found = []
    for block in BLOCK.finditer(text):
        before = text[: block.start()].rstrip("\n").rsplit("\n", 1)[-1]
        line = text[: block.start()].count("\n") + 1
        found.append((line, block.group(1), block.group(2), MARKER.fullmatch(before.strip())))
    return found


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_every_example_says_what_runs_it_or_that_it_is_a_fragment(path: Path) -> None:
    for line, language, _, marker in _blocks(path):
        where = f"{path.name}:{line} ({language})"
        assert marker is not None, f"{where}: no <!-- runs: PATH --> or <!-- fragment: ... -->"
        if marker.group(1) == "runs":
            runner = ROOT / marker.group(2)
            assert runner.is_file(), f"{where}: {marker.group(2)} does not exist"
            # The runner reads the page it runs examples of.
            assert path.name in runner.read_text(encoding="utf-8"), f"{where}: {runner}"


def test_the_asgi_demo_command_runs_as_written() -> None:
    (block,) = (b for _, lang, b, _ in _blocks(README) if "demo --server asgi-uvicorn" in b)
    install, command = block.split("#", 1)[0].split("&&")
    assert install.strip() == "pip install '.[asgi]'"  # the test extra installs it
    program, *args = command.split()
    assert program == "duplex-supervisor"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DUPLEX_SUPERVISOR_SECRET", None)
    result = subprocess.run(  # noqa: S603 - our own interpreter, the README's words
        [sys.executable, "-m", "supervisor", *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
        cwd=ROOT,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "nothing lost or repeated" in result.stdout, result.stdout
    assert "Traceback" not in result.stderr, result.stderr
