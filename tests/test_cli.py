"""``duplex-supervisor`` as a user runs it: subprocesses, exit statuses, output."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from rich.console import Console

from supervisor._system import DEFAULT_PASSIVATE_AFTER_S
from supervisor.cli._chaos import ChaosReport, ClientReport
from supervisor.cli._commands import _gateway_config
from supervisor.cli._demo_processes import reap
from supervisor.cli._flags import SECRET_ENV, parser
from supervisor.cli._run_report import RunFigures, report_table
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._registry import registry_options_for
from supervisor.gateway._server import GatewayConfig
from tests.gateway_support import LIMIT, read_until, read_until_closed, running_gateway

MODULE = [sys.executable, "-m", "supervisor"]
SCRIPT = Path(sys.executable).with_name("duplex-supervisor")

TOTALS = {
    "sessions",
    "events_delivered",
    "disconnects",
    "resumes",
    "replayed",
    "lost",
    "duplicated",
    "errors",
}

#: The flags the gateway issue asks each command to take (and explain).
REQUIRED_FLAGS = {
    "serve": [
        "--host",
        "--port",
        "--max-frame-bytes",
        "--handshake-timeout",
        "--ping-interval",
        "--idle-timeout",
        "--max-sessions",
        "--disconnect-grace",
        "--secret-file",
        "--server",
        "--engine",
        "--trusted-proxy",
        "--log-format",
        "--log-level",
        "--allowed-origin",
        "--tls-cert",
        "--tls-key",
    ],
    "chaos": ["--clients", "--duration", "--drop-rate", "--seed", "--json"],
    "demo": ["--clients", "--duration", "--drop-rate", "--seed", "--json"],
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    env["COLUMNS"] = "200"  # help lines unwrapped, so explanations match whole
    env.update(extra)
    return env


def _run(
    *args: str, timeout: float = 30, command: list[str] = MODULE, tmpdir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """``command args``; with ``tmpdir``, its temporary files (a demo's redis-servers) under it."""
    env = _env(TMPDIR=str(tmpdir)) if tmpdir is not None else _env()
    return subprocess.run(  # noqa: S603 - our own command line
        [*command, *args], capture_output=True, text=True, timeout=timeout, env=env, check=False
    )


def test_demo_json_reports_nothing_lost() -> None:
    result = _run("demo", "--duration", "3", "--json", "--clients", "8", timeout=90)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 1, result.stdout  # one JSON object, nothing else
    report = json.loads(lines[0])
    assert isinstance(report, dict)
    totals = report["totals"]
    assert set(totals) >= TOTALS, totals
    assert totals["lost"] == 0
    assert totals["duplicated"] == 0
    assert totals["errors"] == 0
    assert report["ok"] is True
    assert totals["sessions"] == 8
    assert totals["events_delivered"] > 0
    assert totals["resumes"] == totals["disconnects"]
    assert "Traceback" not in result.stderr


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    for action in parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("duplex-supervisor has no subcommands")


@pytest.mark.parametrize("command", ["serve", "chaos", "demo"])
def test_help_explains_every_flag(command: str) -> None:
    assert SCRIPT.exists(), "the duplex-supervisor console script is not installed"
    result = subprocess.run(  # noqa: S603 - our own command line
        [str(SCRIPT), command, "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        env=_env(),
        check=False,
    )
    assert result.returncode == 0, result.stderr
    shown = " ".join(result.stdout.split())
    parser = _subcommands()[command]
    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    assert set(REQUIRED_FLAGS[command]) <= set(flags)
    for action in parser._actions:
        for flag in action.option_strings:
            assert flag in shown, f"{command} --help does not mention {flag}"
        if action.option_strings and action.dest != "help":
            explained = action.help
            assert explained and explained != argparse.SUPPRESS, f"{action.dest} unexplained"
            assert " ".join(explained.split()) in shown, f"{action.dest}: help not shown"
            assert len(explained.split()) >= 3, f"{action.dest}: {explained!r} explains little"
    if command == "chaos":
        assert "url" in shown.lower()


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["demo", "--clients", "0"], "argument --clients: must be positive"),
        (["demo", "--drop-rate", "-1"], "argument --drop-rate: must be >= 0"),
        (["chaos", "ws://127.0.0.1:9/v1", "--duration", "0"], "argument --duration"),
        (["serve", "--max-frame-bytes", "lots"], "argument --max-frame-bytes"),
        (["serve", "--idle-timeout", "-5"], "argument --idle-timeout: must be positive"),
        (["chaos"], "url"),
    ],
)
def test_bad_flag_value_exits_2_with_a_message(args: list[str], complaint: str) -> None:
    result = _run(*args)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "error:" in result.stderr
    assert complaint in result.stderr
    assert result.stdout == ""


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_settings_the_gateway_refuses_exit_2_with_a_message() -> None:
    result = _run("serve", "--port", "0", "--tls-cert", "cert.pem")
    assert result.returncode == 2
    assert "duplex-supervisor: TLS needs both a certificate and a key" in result.stderr
    result = _run("serve", "--port", "0", "--max-frame-bytes", "100")
    assert result.returncode == 2
    assert "max_frame_bytes must be at least 256" in result.stderr


@pytest.mark.parametrize(
    ("server", "module"), [("asgi-uvicorn", "uvicorn"), ("asgi-hypercorn", "hypercorn")]
)
def test_an_asgi_server_not_installed_is_named_not_a_traceback(server: str, module: str) -> None:
    # `pip install .` leaves the ASGI servers out; the process sees no such module.
    hide = (
        f"import sys; sys.modules[{module!r}] = None; from supervisor.cli._commands import main; "
    )
    command = [sys.executable, "-c", hide + "sys.exit(main(sys.argv[1:]))"]
    result = _run("serve", "--server", server, "--port", "0", command=command)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    expected = f"duplex-supervisor: --server {server} needs {module}: "
    assert last == expected + "pip install 'duplex-supervisor[asgi]'", last


def test_network_errors_exit_2_with_a_message_not_a_traceback() -> None:
    # Raised inside trio nurseries, these come wrapped in exception groups.
    result = _run("chaos", f"ws://127.0.0.1:{_closed_port()}/v1", "--duration", "1")
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert "duplex-supervisor: all attempts to connect" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for server in ("trio", "asgi-uvicorn", "asgi-hypercorn"):
            result = _run("serve", "--server", server, "--port", str(port))
            assert result.returncode == 2, result.stderr
            last = result.stderr.strip().splitlines()[-1]
            assert last == f"duplex-supervisor: 127.0.0.1:{port}: Address already in use", last
    assert "Traceback" not in result.stderr


async def test_chaos_command_against_a_gateway_with_a_secret() -> None:
    config = GatewayConfig(port=0, shared_secret="s3cret")
    with trio.fail_after(LIMIT):
        async with running_gateway(config) as harness:
            command = [*MODULE, "chaos", harness.url, "--json", "--clients", "3"]
            command += ["--duration", "1.5", "--drop-rate", "2", "--seed", "5"]
            result = await trio.run_process(
                command,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
                env=_env(**{SECRET_ENV: "s3cret"}),
            )
            stderr = result.stderr.decode()
            assert result.returncode == 0, stderr
            report = json.loads(result.stdout)
            assert report["ok"] is True
            assert report["totals"]["sessions"] == 3
            assert harness.gateway.counters.sessions_opened == 3
            assert "unauthorized" not in harness.gateway.counters.errors


@dataclass
class _Served:
    process: trio.Process
    url: str
    log: bytearray


@contextlib.asynccontextmanager
async def _serve_process(command: list[str]) -> AsyncIterator[_Served]:
    """``serve`` in a subprocess; ``log`` is its stderr, read whole once it exited."""
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, env=_env())
    assert process.stderr is not None
    try:
        log = bytearray()
        while b"listening on" not in log or not log.endswith(b"\n"):
            chunk = await process.stderr.receive_some()
            assert chunk, log
            log += chunk
        line = next(ln for ln in log.decode().splitlines() if "listening on" in ln)
        url = line.rstrip('"}').rsplit(" ", 1)[-1]
        served = _Served(process, url, log)
        yield served
        await process.wait()
        while chunk := await process.stderr.receive_some():
            log += chunk
    finally:
        await reap(process)


async def test_serve_on_sigint_closes_connections_going_away() -> None:
    # Busy (500 events/s), so a Ctrl-C often lands while some task runs.
    command = [*MODULE, "serve", "--port", "0", "--stats-interval", "0.2", "--event-rate", "500"]
    with trio.fail_after(LIMIT):
        async with _serve_process(command) as served:
            client = await WireClient.connect(served.url)
            try:
                await client.send_json({"type": "session.open"})
                await read_until(client, "response.output_text.delta")
                served.process.send_signal(signal.SIGINT)
                _, closed = await read_until_closed(client)
            finally:
                await client.cut()
            assert (closed.code, closed.reason) == (1001, "going_away")
            assert await served.process.wait() == 130
    assert b"Traceback" not in served.log, served.log.decode()


def test_disconnect_grace_takes_seconds_or_none() -> None:
    parse = parser().parse_args
    assert parse(["serve", "--disconnect-grace", "none"]).disconnect_grace is None
    assert parse(["serve", "--disconnect-grace", "2.5"]).disconnect_grace == 2.5
    for bad in ("0", "-1", "soon"):
        with pytest.raises(SystemExit) as exit_info:
            parse(["serve", "--disconnect-grace", bad])
        assert exit_info.value.code == 2


def test_version_and_verbose_after_the_subcommand() -> None:
    result = _run("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("duplex-supervisor 0.")
    parse = parser().parse_args
    assert parse(["serve", "-v"]).verbose is True
    assert parse(["-v", "demo"]).verbose is True
    assert parse(["chaos", "ws://h:1/v1", "--log-level", "debug"]).log_level == "debug"


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (["serve", "--port", "70000"], "argument --port: must be within 0..65535"),
        (["serve", "--port", "-1"], "argument --port: must be within 0..65535"),
        (["serve", "--port", "http"], "argument --port: must be a port number"),
        (["serve", "--secret", "s3cret"], "argument --secret: a secret on the command line"),
        (["chaos", "ws://h:1/v1", "--secret", "x"], "argument --secret: a secret on the"),
        (["serve", "--server", "tornado"], "argument --server: invalid choice"),
        (["serve", "--log-format", "xml"], "argument --log-format: invalid choice"),
        (["serve", "--session-resume-window", "0"], "argument --session-resume-window"),
        (["serve", "--event-rate", "nan"], "argument --event-rate: must be >= 0"),
        (["demo", "--drop-rate", "nan"], "argument --drop-rate: must be >= 0"),
        (["serve", "--max-inputs-per-second", "nan"], "argument --max-inputs-per-second"),
    ],
)
def test_flags_are_validated_naming_the_flag(args: list[str], complaint: str) -> None:
    result = _run(*args)
    assert result.returncode == 2, result.stderr
    assert complaint in result.stderr, result.stderr
    assert "s3cret" not in result.stderr


def test_settings_from_files_and_modules_name_what_is_wrong(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = _run("serve", "--port", "0", "--secret-file", str(missing))
    assert result.returncode == 2
    assert f"--secret-file {missing}: No such file or directory" in result.stderr
    result = _run("serve", "--port", "0", "--engine", "no_such_module_here:make")
    assert result.returncode == 2
    assert "--engine 'no_such_module_here:make': cannot import" in result.stderr
    for server in ("trio", "asgi-uvicorn", "asgi-hypercorn"):
        result = _run(
            "serve", "--server", server, "--tls-cert", str(missing), "--tls-key", str(missing)
        )
        assert result.returncode == 2
        expected = f"--tls-cert {missing} / --tls-key {missing}: No such file or directory"
        assert expected in result.stderr, result.stderr
    result = _run("serve", "--port", "0", "--trusted-proxy", "not-an-address")
    assert result.returncode == 2
    assert "trusted_proxies: 'not-an-address' is no address or network" in result.stderr


async def test_serve_with_engine_and_hook_from_modules_logs_json_without_third_party_noise(
    tmp_path: Path,
) -> None:
    secret_file = tmp_path / "secret"
    secret_file.write_text("s3cret\n")
    command = [*MODULE, "serve", "--port", "0", "-v", "--log-format", "json"]
    command += [
        "--secret-file",
        str(secret_file),
        "--engine",
        "examples.fastapi_app:SpellingEngine",
        "--authenticate",
        "examples.fastapi_app:authenticate",
    ]
    with trio.fail_after(LIMIT):
        async with _serve_process(command) as served:
            nobody = await WireClient.connect(served.url)
            _, closed = await read_until_closed(nobody)  # the hook wants ?user=
            await nobody.cut()
            assert closed.code == 4401
            client = await WireClient.connect(served.url + "?user=ada")
            try:
                await client.send_json({"type": "session.open", "secret": "s3cret"})
                assert (await client.receive_json())["type"] == "session.created"
                hello = await client.receive_json()  # the engine's own, with the identity
                assert (hello["type"], hello["user"]) == ("hello", "ada")
                await client.send_json({"type": "input", "client_event_id": "a", "text": "ok"})
                letters = [await client.receive_json() for _ in range(3)]
                assert [f.get("letter", f["type"]) for f in letters] == ["o", "k", "response.done"]
                await client.send_json({"type": "session.close"})
                await read_until_closed(client)
            finally:
                await client.cut()
            served.process.send_signal(signal.SIGTERM)
            assert await served.process.wait() == 0
    log = bytes(served.log)
    records = [json.loads(ln) for ln in log.decode().splitlines()]
    # -v: ours at DEBUG, and not one line of wsproto, h11 or pykka.
    assert {r["logger"] for r in records} == {"duplex_supervisor.supervisor"}, records
    assert any(r["level"] == "DEBUG" and "opened" in r["message"] for r in records), records
    assert any("SIGTERM" in r["message"] for r in records)
    assert "s3cret" not in log.decode()


def test_demo_on_uvicorn_reports_nothing_lost() -> None:
    result = _run(
        "demo", "--server", "asgi-uvicorn", "--duration", "3", "--json", "--clients", "6",
        timeout=90,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    totals = json.loads(result.stdout)["totals"]
    assert (totals["lost"], totals["duplicated"], totals["errors"]) == (0, 0, 0), totals
    assert totals["sessions"] == 6 and totals["resumes"] > 0, totals


async def test_chaos_speaks_wss_with_a_ca_file_and_reports_http_statuses(tmp_path: Path) -> None:
    from tests.attack_support import make_certificate, server_process

    cert, key = make_certificate(tmp_path)
    with trio.fail_after(LIMIT):
        async with server_process("--event-rate", "50", tls=(cert, key)) as server:
            url = f"wss://127.0.0.1:{server.port}/v1"
            command = [*MODULE, "chaos", url, "--ca-file", cert, "--json", "--clients", "3"]
            command += ["--duration", "1.5", "--drop-rate", "2", "--seed", "3"]
            result = await trio.run_process(
                command, capture_stdout=True, capture_stderr=True, check=False, env=_env()
            )
            assert result.returncode == 0, result.stderr.decode()
            report = json.loads(result.stdout)
            assert report["ok"] is True and report["totals"]["resumes"] > 0, report
            wrong = f"wss://127.0.0.1:{server.port}/elsewhere"
            command = [*MODULE, "chaos", wrong, "--ca-file", cert, "--duration", "1"]
            result = await trio.run_process(
                command, capture_stdout=True, capture_stderr=True, check=False, env=_env()
            )
    assert result.returncode == 2
    assert f"{wrong}: the server answered HTTP 404" in result.stderr.decode()


def _float_flags() -> list[tuple[str, str]]:
    """(command, flag) for every flag whose value is a number with a fraction."""
    found = []
    for command, sub in _subcommands().items():
        for action in sub._actions:
            flags = [s for s in action.option_strings if s.startswith("--")]
            if not flags or not callable(action.type):
                continue
            try:
                action.type("1.5")
            except (ValueError, TypeError, argparse.ArgumentTypeError):
                continue
            found.append((command, flags[0]))
    return found


def test_every_duration_and_rate_flag_is_found() -> None:
    flags = {flag for _, flag in _float_flags()}
    assert {"--handshake-timeout", "--disconnect-grace", "--event-rate", "--drop-rate"} <= flags
    assert {"--send-timeout", "--stats-interval", "--duration", "--passivate-after"} <= flags


@pytest.mark.parametrize(("command", "flag"), _float_flags())
@pytest.mark.parametrize("infinite", ["inf", "-inf", "Infinity", "1e999"])
def test_no_flag_takes_an_infinite_value(
    command: str, flag: str, infinite: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [command] + (["ws://h:1/v1"] if command == "chaos" else []) + [f"{flag}={infinite}"]
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(args)
    assert exit_info.value.code == 2
    complaint = capsys.readouterr().err
    assert f"argument {flag}: must " in complaint, complaint
    if not infinite.startswith("-"):
        assert "must be finite" in complaint, complaint


@pytest.mark.parametrize("flag", ["--disconnect-grace", "--passivate-after"])
def test_never_is_spelled_none_not_infinity(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert getattr(parser().parse_args(["serve", flag, "none"]), flag[2:].replace("-", "_")) is None
    with pytest.raises(SystemExit):
        parser().parse_args(["serve", flag, "inf"])
    assert f"argument {flag}: must be finite ('none' turns it off), got inf" in (
        capsys.readouterr().err
    )


def test_serve_refuses_an_infinite_handshake_timeout() -> None:
    result = _run("serve", "--port", "0", "--handshake-timeout", "inf")
    assert result.returncode == 2, result.stderr
    assert "argument --handshake-timeout: must be finite, got inf" in result.stderr


@pytest.mark.parametrize(
    ("flag", "after"),
    [([], 30.0), (["--passivate-after", "none"], None), (["--passivate-after", "0.5"], 0.5)],
)
def test_passivate_after_reaches_the_gateways_registry(
    flag: list[str], after: float | None
) -> None:
    config = _gateway_config(parser().parse_args(["serve", *flag]))
    assert config.passivate_after_s == after
    chosen = registry_options_for(config, None, observer=lambda event: None, faults=None)
    assert chosen.passivate_after_s == after


def test_the_gateway_config_refuses_a_passivation_that_is_no_duration() -> None:
    assert GatewayConfig().passivate_after_s == DEFAULT_PASSIVATE_AFTER_S
    assert GatewayConfig(passivate_after_s=0).passivate_after_s == 0
    assert GatewayConfig(passivate_after_s=None).passivate_after_s is None
    for bad in (-1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="passivate_after_s must be None or a finite"):
            GatewayConfig(passivate_after_s=bad)


def test_the_table_names_each_kind_of_error_beside_the_count() -> None:
    """A failed run says which errors it met, not only how many (the cluster
    demo once failed on ``errors 1`` and its table could not say why)."""
    totals = ClientReport(errors=3, error_codes={"replaced": 2, "unknown_session": 1})
    console = Console(width=200, record=True)
    console.print(report_table(ChaosReport(totals=totals, clients=[]), None, RunFigures()))
    text = console.export_text()
    assert re.search(r"│ errors +│ +3 │", text), text
    assert re.search(r"│ errors by kind +│ +replaced 2, unknown_session 1 │", text), text

    clean = Console(width=200, record=True)
    clean.print(report_table(ChaosReport(totals=ClientReport(), clients=[]), None, RunFigures()))
    assert "errors by kind" not in clean.export_text()  # no row for what did not happen
