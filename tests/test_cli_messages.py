"""What a new user reads: one line for a mistake or a missing extra, progress on a long run."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from supervisor.cli._flags import parser

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DUPLEX_SUPERVISOR_SECRET", None)
    return env


def _run(
    *args: str, without: tuple[str, ...] = (), timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``duplex-supervisor ARGS`` in a child, as if the packages ``without`` were not installed."""
    program = (
        "import sys\n"
        f"for name in {without!r}:\n"
        "    sys.modules[name] = None  # import and find_spec now say: not installed\n"
        "from supervisor.cli._commands import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    return subprocess.run(  # noqa: S603 - our own interpreter and program
        [sys.executable, "-c", program, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(),
        cwd=ROOT,
        check=False,
    )


@pytest.mark.parametrize(
    ("args", "without", "line"),
    [
        (
            ["serve", "--port", "0", "--redis", "redis://127.0.0.1:1/0"],
            ("redis",),
            "duplex-supervisor: --redis needs redis: pip install 'duplex-supervisor[redis]'",
        ),
        (
            ["demo", "--processes", "3", "--redis", "local", "--duration", "1"],
            ("redis",),
            "duplex-supervisor: --redis needs redis: pip install 'duplex-supervisor[redis]'",
        ),
        (
            ["demo", "--server", "asgi-uvicorn", "--duration", "1"],
            ("uvicorn",),
            "duplex-supervisor: --server asgi-uvicorn needs uvicorn: "
            "pip install 'duplex-supervisor[asgi]'",
        ),
        (
            ["demo", "--server", "asgi-hypercorn", "--duration", "1"],
            ("hypercorn",),
            "duplex-supervisor: --server asgi-hypercorn needs hypercorn: "
            "pip install 'duplex-supervisor[asgi]'",
        ),
        (
            ["serve", "--port", "0", "--server", "asgi-uvicorn"],
            ("uvicorn",),
            "duplex-supervisor: --server asgi-uvicorn needs uvicorn: "
            "pip install 'duplex-supervisor[asgi]'",
        ),
    ],
)
def test_a_missing_extra_is_one_line_naming_it(
    args: list[str], without: tuple[str, ...], line: str
) -> None:
    result = _run(*args, without=without)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [line], result.stderr


def test_importing_the_redis_store_without_redis_names_the_extra() -> None:
    program = (
        "import sys\nsys.modules['redis'] = None\n"
        "try:\n    import supervisor.redis_store\n"
        "except ModuleNotFoundError as exc:\n    print(exc)\n"
    )
    result = subprocess.run(  # noqa: S603 - our own interpreter and program
        [sys.executable, "-c", program], capture_output=True, text=True, env=_env(), check=False
    )
    expected = "supervisor.redis_store needs redis: pip install 'duplex-supervisor[redis]'"
    assert result.stdout.strip() == expected, result


@pytest.mark.parametrize(
    ("flag", "value", "complaint"),
    [
        ("--disconnect-grace", "forever", "expected seconds (a number) or 'none', got 'forever'"),
        ("--passivate-after", "later", "expected seconds (a number) or 'none', got 'later'"),
        ("--handshake-timeout", "soon", "expected a number, got 'soon'"),
        ("--max-sessions", "many", "expected a whole number, got 'many'"),
        ("--replay-max-bytes", "4 MB of it", "expected a size in bytes"),
        ("--replay-max-bytes", "4XB", "expected a size in bytes"),
        ("--replay-max-bytes", "0KiB", "must be positive"),
        ("--replay-max-bytes", "1.5", "must be a whole number of bytes, got 1.5"),
        ("--replay-max-bytes", "inf", "expected a size in bytes"),
    ],
)
def test_a_bad_value_says_what_the_flag_takes(
    flag: str, value: str, complaint: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parser().parse_args(["serve", flag, value])
    assert exit_info.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {flag}: {complaint}" in error, error
    assert "invalid parse value" not in error


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("4194304", 4 << 20),
        ("4MiB", 4 << 20),
        ("4 MiB", 4 << 20),
        ("4mib", 4 << 20),
        ("512KiB", 512 << 10),
        ("1MB", 1_000_000),
        ("64kb", 64_000),
        ("1.5MiB", 3 << 19),
        ("2048B", 2048),
    ],
)
def test_byte_flags_take_the_units_the_help_shows(text: str, size: int) -> None:
    args = parser().parse_args(["serve", "--replay-max-bytes", text, "--max-frame-bytes", text])
    assert (args.replay_max_bytes, args.max_frame_bytes) == (size, size)


def test_the_help_prints_the_byte_default_in_a_unit_the_flag_takes() -> None:
    (serve,) = (
        action.choices["serve"]
        for action in parser()._actions
        if isinstance(action, argparse._SubParsersAction)
    )
    help_text = " ".join(serve.format_help().split())
    assert "(default 4 MiB)" in help_text
    assert parser().parse_args(["serve", "--replay-max-bytes", "4 MiB"]).replay_max_bytes == 4 << 20


def test_chaos_refuses_a_url_that_is_no_websocket_in_one_line_first() -> None:
    result = _run("chaos", "http://127.0.0.1:1/v1")
    assert result.returncode == 2
    assert result.stderr.startswith("usage: "), repr(result.stderr[:40])
    assert result.stderr.splitlines()[-1] == (
        "duplex-supervisor chaos: error: argument url: "
        "need a ws:// or wss://host:port/path URL, got 'http://127.0.0.1:1/v1'"
    )


def test_demo_off_a_terminal_prints_progress_lines_and_json_has_the_server_rows() -> None:
    result = _run("demo", "--duration", "5", "--clients", "4", "--json", timeout=90)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)  # stdout stays one JSON object
    progress = [line for line in result.stderr.splitlines() if line.startswith("chaos: ")]
    assert len(progress) >= 2, result.stderr  # one every 2 s of a 5 s run
    assert progress[0].startswith("chaos: 0/5 s, ")
    server = report["server"]
    assert set(server) == {"events_journaled", "crashes", "restarts"}
    # Every delivered event was journaled first (and nothing crashed here).
    assert server["events_journaled"] >= report["totals"]["events_delivered"] > 0
    assert (server["crashes"], server["restarts"]) == (0, 0)


def test_hypercorn_on_a_busy_port_says_so_before_anything_else() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = _run("serve", "--server", "asgi-hypercorn", "--port", str(port))
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f"duplex-supervisor: 127.0.0.1:{port}: Address already in use"
    ], result.stderr


async def test_a_child_server_that_did_not_start_is_said_with_one_prefix() -> None:
    import trio.testing

    from supervisor.cli._demo_processes import listening_url

    send, receive = trio.testing.memory_stream_one_way_pair()
    await send.send_all(b"duplex-supervisor: 127.0.0.1:8765: Address already in use\n")
    await send.aclose()
    with pytest.raises(ValueError) as error:
        await listening_url(receive)
    assert str(error.value) == "the server did not start: 127.0.0.1:8765: Address already in use"
