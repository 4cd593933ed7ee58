"""The pytest plugin, run the way a user's suite runs it: through pytester."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

TESTING_PAGE = Path(__file__).resolve().parent.parent / "docs" / "testing.md"


def _page_examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", TESTING_PAGE.read_text(encoding="utf-8"), re.S)


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    # A user's project: pytest-trio in its default (non trio_mode) setup.
    pytester.makeini("[pytest]\ntimeout = 60\nfilterwarnings = error\n")
    return pytester


@pytest.mark.parametrize("index", range(len(_page_examples())))
def test_every_example_of_the_testing_page_passes(suite: pytest.Pytester, index: int) -> None:
    suite.makepyfile(test_example=_page_examples()[index])
    result = suite.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_the_page_shows_a_crash_a_hung_client_and_a_clock_jump() -> None:
    examples = "\n".join(_page_examples())
    assert "duplex_faults.crash(" in examples
    assert "duplex_faults.hang_send(" in examples
    assert "duplex_clock.advance(" in examples


def test_the_plugin_loads_from_its_entry_point_and_can_be_turned_off(
    suite: pytest.Pytester,
) -> None:
    suite.makepyfile(
        test_loaded="def test_clock(duplex_clock):\n    assert duplex_clock() == 1000.0\n"
    )
    suite.runpytest_subprocess("-q", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    off = suite.runpytest_subprocess("-q", "-p", "no:cacheprovider", "-p", "no:duplex_supervisor")
    off.assert_outcomes(errors=1)


def test_a_failing_engine_test_fails(suite: pytest.Pytester) -> None:
    # The fixtures do not hide failures: a wrong expectation about the wire fails.
    suite.makepyfile(
        test_wrong="""
def test_wrong(duplex_thread_registry, duplex_wire):
    registry = duplex_thread_registry
    registry.create("s1", send=duplex_wire.send_blocking, close=duplex_wire.close_blocking)
    registry.send_event("s1", {"n": 1})
    assert duplex_wire.frames == []
"""
    )
    suite.runpytest_subprocess("-q", "-p", "no:cacheprovider").assert_outcomes(failed=1)


def test_each_test_gets_a_fresh_clock_plan_and_wire(suite: pytest.Pytester) -> None:
    suite.makepyfile(
        test_fresh="""
import pytest

@pytest.mark.parametrize("round", [1, 2])
def test_fresh(round, duplex_clock, duplex_faults, duplex_wire):
    assert duplex_clock() == 1000.0 and duplex_wire.frames == []
    assert not duplex_faults.fired
    duplex_clock.advance(5)
    duplex_faults.crash("send_event.enter")
    duplex_wire.frames.append({"round": round})
"""
    )
    suite.runpytest_subprocess("-q", "-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_the_page_names_the_extra_that_brings_pytest_trio() -> None:
    import tomllib

    pyproject = tomllib.loads((TESTING_PAGE.parent.parent / "pyproject.toml").read_text("utf-8"))
    testing = pyproject["project"]["optional-dependencies"]["testing"]
    assert any(requirement.startswith("pytest-trio") for requirement in testing)
    assert "pip install 'duplex-supervisor[testing]'" in TESTING_PAGE.read_text(encoding="utf-8")
