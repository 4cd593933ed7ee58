"""Running one benchmark scenario in ``--quick`` mode, as ``.ci/run`` does, for its shape."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.redis_support import redis_binary


def run_quick_with_redis(scenario: str, tmp_path: Path) -> tuple[dict[str, str], Any]:
    """``python -m benchmarks --quick --only SCENARIO``: each table row's unit by its
    name, and the scenario's JSON entry for the trio shell. The scenario starts a
    redis-server of its own: skipped (failed in CI) without one."""
    redis_binary()
    out = tmp_path / "bench.json"
    done = subprocess.run(  # noqa: S603 - our own interpreter and module
        [sys.executable, "-m", "benchmarks", "--quick", "--only", scenario, "--json", out],
        capture_output=True,
        timeout=110,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    units = {line[:34].strip(): line[48:71].strip() for line in done.stdout.decode().splitlines()}
    return units, json.loads(out.read_text())["scenarios"][scenario]["trio"]
