"""``serve --demo-page``: the page at ``/`` and the browser client module it
loads, on every server; off by default; the module served is clients/js's."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from supervisor.cli._demo_processes import reap
from supervisor.gateway._demo_page import client_module_source
from tests.attack_support import http_get, server_process

SERVERS = ["trio", "asgi-uvicorn", "asgi-hypercorn"]
LIMIT = 30
SOURCE = Path(__file__).resolve().parent.parent / "clients" / "js" / "duplex-client.js"


async def _get(port: int, path: str) -> tuple[int, str]:
    return await http_get("127.0.0.1", port, path)


@pytest.mark.parametrize("server", SERVERS)
async def test_the_demo_page_and_its_client_are_served_when_asked(server: str) -> None:
    with trio.fail_after(LIMIT):
        flags = ("--server", server, "--demo-page", "--path", "/live")
        async with server_process(*flags) as process:
            # (Its content types: a browser runs the module only as JavaScript,
            # which tests/test_browser.py sees.)
            status, page = await _get(process.port, "/")
            assert status == 200
            assert page.startswith("<!doctype html>")
            assert '<meta name="duplex-path" content="/live">' in page
            assert "window.duplexStats" in page
            status, module = await _get(process.port, "/duplex-client.js")
            assert status == 200
            assert module == SOURCE.read_text(encoding="utf-8")


async def test_the_demo_page_is_off_by_default() -> None:
    with trio.fail_after(LIMIT):
        async with server_process("--server", "trio") as process:
            for path in ("/", "/duplex-client.js"):
                status, body = await _get(process.port, path)
                assert status in (404, 426)  # not found; or: this path wants a WebSocket
                assert "DuplexClient" not in body


def test_the_served_module_is_the_one_source() -> None:
    assert client_module_source() == SOURCE.read_bytes()


async def test_demo_browser_serves_the_page_and_stays_up_until_interrupted() -> None:
    command = [sys.executable, "-m", "supervisor", "demo", "--browser"]
    command += ["--clients", "2", "--duration", "1"]
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE)
    assert process.stderr is not None
    try:
        with trio.fail_after(LIMIT):
            log = ""
            while "stays at" not in log:
                chunk = await process.stderr.receive_some()
                assert chunk, log
                log += chunk.decode()
            url = re.search(r"open (http://127\.0\.0\.1:(\d+)/)", log)
            assert url is not None, log
            status, body = await _get(int(url.group(2)), "/")
            assert status == 200
            assert "window.duplexStats" in body
            process.send_signal(signal.SIGINT)
            assert await process.wait() == 130
    finally:
        await reap(process)
