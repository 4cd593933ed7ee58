"""The README's examples run as written, 50 times each, with the frames they promise.

Each ``python`` block of "The API, one example per front door" is a whole
program whose ``assert`` lines state the frames it promises; it is run as
written, in a fresh namespace, 50 times in a row (one run in four of the old
thread door's example lost its frame).
"""

from __future__ import annotations

import gc
import re
import threading
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
RUNS = 50


def _api_examples() -> list[str]:
    text = README.read_text(encoding="utf-8")
    section = text.split("## The API, one example per front door", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```python\n(.*?)```", section, re.S)


def test_every_front_door_has_a_whole_example() -> None:
    examples = _api_examples()
    assert len(examples) == 5
    for example, door in zip(
        examples,
        ["open_session_registry", "open_asyncio_registry", "compat", "ThreadSessionRegistry"],
        strict=False,
    ):
        assert door in example
        assert "assert " in example  # it states the frames it promises


@pytest.mark.parametrize("index", range(len(_api_examples())))
def test_the_example_runs_as_written_every_time(index: int) -> None:
    example = _api_examples()[index]
    code = compile(example, f"README.md example {index + 1}", "exec")
    for _ in range(RUNS):
        exec(code, {"__name__": "__readme__"})  # noqa: S102 - the README's own code
    # The drop-in is never closed: its finalizer stops its actors, the
    # supervisor too, once the registry is garbage. Every other door has
    # joined its threads already.
    gc.collect()
    for thread in threading.enumerate():
        if thread.name.startswith("duplex-"):
            thread.join(10)
    assert [t.name for t in threading.enumerate() if t.name.startswith("duplex-")] == []
