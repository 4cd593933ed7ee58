"""The README's Redis program runs as written against a real Redis, and says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.redis_support import RedisServer, free_port

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _redis_program() -> str:
    section = README.read_text(encoding="utf-8").split("## More than one process", 1)[1]
    blocks = [b for b in re.findall(r"```python\n(.*?)```", section, re.S) if "RedisStore" in b]
    assert len(blocks) == 1, blocks
    return str(blocks[0])


def _run(tmp_path: Path, url: str) -> subprocess.CompletedProcess[str]:
    program = tmp_path / "redis_program.py"
    program.write_text(_redis_program(), encoding="utf-8")
    env = {**os.environ, "DUPLEX_REDIS_URL": url, "PYTHONPATH": str(ROOT)}
    return subprocess.run(  # noqa: S603 - our own interpreter, the README's program
        [sys.executable, str(program)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_the_readmes_redis_program_resumes_on_the_other_registry(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    result = _run(tmp_path, redis_server.url)
    assert result.returncode == 0, result.stderr
    assert "replayed by the other process: [{'text': 'lo', 'server_event_seq': 2}]" in (
        result.stdout
    )


def test_the_readmes_redis_program_without_redis_fails_at_once_naming_the_store(
    tmp_path: Path,
) -> None:
    result = _run(tmp_path, f"redis://127.0.0.1:{free_port()}/0")
    assert result.returncode == 1
    assert "StoreUnavailableError" in result.stderr
