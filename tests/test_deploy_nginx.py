"""docs/deploy.md's nginx configuration, run as written in front of two
``serve --workers 2`` processes on one Redis: a session resumes through nginx
after the worker process that held it is killed, nothing lost or repeated.

The configuration is read from the page itself (its ``nginx`` block); only its
three ports are changed to free ones. nginx runs unprivileged with a prefix of
the test's own. Skipped without nginx (Debian: apt-get install nginx) unless
``DUPLEX_REQUIRE_NGINX=1`` (set by ``.ci/run``), and without redis-server (see
tests/redis_support.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from tests.gateway_support import contiguous, seqs
from tests.redis_support import RedisServer, free_port
from tests.test_cli import MODULE
from tests.worker_support import (
    Workers,
    connections_of,
    free_ports,
    resume_after,
    serving_workers,
    stream_until_killed,
)

DEPLOY = Path(__file__).resolve().parent.parent / "docs" / "deploy.md"
HOW_TO_RUN = (
    "nginx not installed: install it (Debian: apt-get install nginx) to run the "
    "deployment recipe's test; .ci/run does, and sets DUPLEX_REQUIRE_NGINX=1"
)
LIMIT = 120.0

#: The main file around the page's configuration: everything under the prefix.
_MAIN = """daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log notice;
events {{ worker_connections 256; }}
http {{
    access_log {prefix}/access.log;
    client_body_temp_path {prefix}/client_body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    include {prefix}/duplex.conf;
}}
"""


def nginx_binary() -> str:
    """nginx's path, or skip (fail under DUPLEX_REQUIRE_NGINX=1)."""
    binary = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if binary is None:
        if os.environ.get("DUPLEX_REQUIRE_NGINX") == "1":
            pytest.fail(HOW_TO_RUN)
        pytest.skip(HOW_TO_RUN)
    return binary


def the_pages_configuration() -> str:
    """The ``nginx`` block of docs/deploy.md, as the page shows it."""
    text = DEPLOY.read_text(encoding="utf-8")
    (block,) = re.findall(r"^```nginx\n(.*?)^```", text, re.S | re.M)
    return str(block)


def test_the_page_shows_the_ports_the_test_replaces() -> None:
    block = the_pages_configuration()
    for port in ("8080", "8765", "8766"):
        assert block.count(port) == 1, port
    assert "proxy_set_header Upgrade $http_upgrade;" in block
    assert "location = /readyz" in block


@contextlib.asynccontextmanager
async def running_nginx(binary: str, prefix: Path, ports: dict[str, int]) -> AsyncIterator[int]:
    """nginx with the page's configuration (its ports replaced); yields its port."""
    conf = the_pages_configuration()
    for old, new in ports.items():
        conf = conf.replace(old, str(new))
    (prefix / "duplex.conf").write_text(conf, encoding="utf-8")
    (prefix / "nginx.conf").write_text(_MAIN.format(prefix=prefix), encoding="utf-8")
    argv = [binary, "-p", str(prefix), "-c", str(prefix / "nginx.conf")]
    process = await trio.lowlevel.open_process(argv, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{ports['8080']}/readyz"
        while await trio.to_thread.run_sync(_answer, url) != "ready":
            assert process.returncode is None, (prefix / "error.log").read_text()
            await trio.sleep(0.05)
        yield ports["8080"]
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGQUIT)  # nginx's graceful stop
        with trio.CancelScope(shield=True), trio.move_on_after(10):
            await process.wait()
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()


def _answer(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - loopback http
            return str(answer.read().decode().strip())
    except OSError:
        return ""


async def _holder(processes: list[tuple[Workers, int]]) -> int:
    """The pid of the one worker, of every process, holding a connection."""
    with trio.fail_after(10):
        while True:
            holding = []
            for workers, metrics in processes:
                for index, pid in workers.pids().items():
                    port = metrics + index
                    if await trio.to_thread.run_sync(connections_of, port) > 0:
                        holding.append(pid)
            if len(holding) == 1:
                return holding[0]
            await trio.sleep(0.05)


async def test_a_session_resumes_through_nginx_after_its_worker_is_killed(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    binary = nginx_binary()
    ports = {"8080": free_port(), "8765": free_port(), "8766": free_port()}
    metrics = [free_ports(2), free_ports(2)]

    def serve(port: int, metrics_port: int) -> list[str]:
        return [
            *MODULE, "serve", "--workers", "2", "--port", str(port),
            "--redis", redis_server.url, "--trusted-proxy", "127.0.0.1",
            "--metrics-port", str(metrics_port), "--event-rate", "50",
        ]  # fmt: skip

    with trio.fail_after(LIMIT):
        async with (
            serving_workers(serve(ports["8765"], metrics[0])) as first,
            serving_workers(serve(ports["8766"], metrics[1])) as second,
            running_nginx(binary, tmp_path, ports) as port,
        ):
            url = f"ws://127.0.0.1:{port}/v1"

            async def kill() -> None:  # the worker, of either process, holding it
                pid = await _holder([(first, metrics[0]), (second, metrics[1])])
                os.kill(pid, signal.SIGKILL)

            # nginx closes the client's connection when the worker behind it dies.
            frames = await stream_until_killed(url, kill)
            client, after = await resume_after(url, frames)
            await client.cut()
            for workers in (first, second):
                workers.process.send_signal(signal.SIGTERM)
    numbers = seqs(frames) + seqs(after)
    assert contiguous(1, numbers), numbers  # nothing lost, nothing repeated
    assert first.process.returncode == second.process.returncode == 0
    assert b"exited on SIGKILL" in first.log + second.log  # and started again
