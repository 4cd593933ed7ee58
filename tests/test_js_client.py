"""The browser client (clients/js/) under Node's own test runner, against a real
``serve`` child (the Node tests start it with this Python), through a proxy
that cuts connections. Skipped where Node is absent, unless
``DUPLEX_REQUIRE_NODE=1`` (.ci/run sets it)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.client import FATAL_CLOSE_CODES

JS = Path(__file__).resolve().parent.parent / "clients" / "js"


def test_the_js_client_passes_its_node_tests() -> None:
    node = shutil.which("node") or "node"
    version = ""
    if shutil.which(node):
        version = subprocess.check_output([node, "--version"], text=True)  # noqa: S603
    if not version.startswith("v") or int(version[1:].split(".")[0]) < 20:
        missing = f"the JS client's tests need Node >= 20 (found: {version.strip() or 'none'})"
        if os.environ.get("DUPLEX_REQUIRE_NODE") == "1":
            pytest.fail(f"DUPLEX_REQUIRE_NODE=1 but {missing}")
        pytest.skip(missing)
    result = subprocess.run(  # noqa: S603 - our own test files
        [node, "--experimental-websocket", "--test", "test/"],
        cwd=JS,
        env={**os.environ, "DUPLEX_PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=110,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "# fail 0" in result.stdout


def test_both_clients_end_on_the_same_fatal_close_codes() -> None:
    source = (JS / "duplex-client.js").read_text(encoding="utf-8")
    table = re.search(r"const FATAL_CLOSE_CODES = Object\.freeze\(\{(.*?)\}\);", source, re.S)
    assert table is not None
    codes = {int(code): name for code, name in re.findall(r'(\d+): "(\w+)"', table.group(1))}
    assert codes == FATAL_CLOSE_CODES
