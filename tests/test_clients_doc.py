"""docs/clients.md's Python example runs as written against a real gateway."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import trio

from supervisor.gateway._engine import EngineConfig
from tests.gateway_support import LIMIT, running_gateway

DOC = Path(__file__).resolve().parent.parent / "docs" / "clients.md"


def _block() -> str:
    text = DOC.read_text(encoding="utf-8")
    found = re.findall(r"<!-- runs: tests/test_clients_doc.py -->\n```python\n(.*?)```", text, re.S)
    assert len(found) == 1
    return str(found[0])


async def test_the_python_example_runs_against_a_gateway() -> None:
    namespace: dict[str, object] = {"__name__": "clients_doc"}
    exec(compile(_block(), str(DOC), "exec"), namespace)  # noqa: S102 - the doc's own code
    main = namespace["main"]
    out = io.StringIO()
    with trio.fail_after(LIMIT), contextlib.redirect_stdout(out):
        async with running_gateway(engine=EngineConfig(event_rate_hz=0)) as harness:
            await main(harness.url)  # type: ignore[operator]
    lines = out.getvalue().splitlines()
    assert lines[-2].endswith("response.done")
    assert lines[-1] == "0 resumes"
