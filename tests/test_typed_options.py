"""Every door names its options: a type checker and the door itself refuse a misspelled one."""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
import sys
import typing
from collections.abc import Callable
from pathlib import Path

import pytest

import supervisor
from supervisor.compat import DuplexSessionAttachmentRegistry

ROOT = Path(__file__).resolve().parent.parent

REQUIRED = {"replay_ttl_s": 60.0, "replay_max_bytes_per_session": 1 << 20}

#: Every door's entry point (``# door`` marks where each call starts), called
#: with the required options and ``{extra}``.
SNIPPET = """\
import supervisor
from supervisor.compat import DuplexSessionAttachmentRegistry


async def trio_door() -> None:
    async with supervisor.open_session_registry(  # door
        replay_ttl_s=60, replay_max_bytes_per_session=1024, {extra}
    ) as registry:
        print(registry)


async def asyncio_door() -> None:
    async with supervisor.open_asyncio_registry(  # door
        replay_ttl_s=60, replay_max_bytes_per_session=1024, {extra}
    ) as registry:
        print(registry)
    bound = supervisor.AsyncioSessionRegistry(  # door
        replay_ttl_s=60, replay_max_bytes_per_session=1024, {extra}
    )
    await bound.aclose()


def thread_door() -> None:
    with supervisor.ThreadSessionRegistry(  # door
        timeout=5, replay_ttl_s=60, replay_max_bytes_per_session=1024, {extra}
    ) as registry:
        print(registry)


def drop_in() -> None:
    print(DuplexSessionAttachmentRegistry(replay_ttl_s=60, {seed_extra}))  # door
"""


def test_the_typed_dict_names_every_option_with_its_type() -> None:
    hints = typing.get_type_hints(supervisor.RegistryOptionsDict)
    assert hints == typing.get_type_hints(supervisor.RegistryOptions)
    required = {
        field.name
        for field in dataclasses.fields(supervisor.RegistryOptions)
        if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
    }
    assert supervisor.RegistryOptionsDict.__required_keys__ == required


def _mypy_errors(tmp_path: Path, name: str, extra: str, seed_extra: str) -> list[str]:
    snippet = tmp_path / f"{name}.py"
    snippet.write_text(SNIPPET.format(extra=extra, seed_extra=seed_extra), encoding="utf-8")
    ran = subprocess.run(  # noqa: S603 - our interpreter, our files
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(tmp_path / "cache"),
            str(snippet),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert "error: Cannot find" not in ran.stdout, ran.stdout
    return [line for line in ran.stdout.splitlines() if ": error: " in line]


def test_mypy_refuses_a_misspelled_option_at_every_door(tmp_path: Path) -> None:
    good = _mypy_errors(
        tmp_path, "good", "sweep_interval_s=None", "replay_max_bytes_per_session=1024"
    )
    assert good == []
    misspelled = _mypy_errors(
        tmp_path, "misspelled", "sweep_intervl_s=None", "replay_max_bytes_per_sesion=1024"
    )
    text = SNIPPET.format(extra="sweep_intervl_s=None", seed_extra="x")
    calls = [number for number, line in enumerate(text.splitlines(), start=1) if "# door" in line]
    assert len(calls) == 5  # four doors' entry points and the drop-in
    refused = {
        int(line.split(":")[1])
        for line in misspelled
        if '"sweep_intervl_s"' in line or '"replay_max_bytes_per_sesion"' in line
    }
    assert refused == set(calls), misspelled


def _trio_door(**options: typing.Any) -> None:
    import trio

    async def main() -> None:
        async with supervisor.open_session_registry(**options):
            pass

    trio.run(main)


def _asyncio_door(**options: typing.Any) -> None:
    async def main() -> None:
        async with supervisor.open_asyncio_registry(**options):
            pass

    asyncio.run(main())


def _asyncio_class(**options: typing.Any) -> None:
    async def main() -> None:
        await supervisor.AsyncioSessionRegistry(**options).aclose()

    asyncio.run(main())


def _thread_door(**options: typing.Any) -> None:
    with supervisor.ThreadSessionRegistry(timeout=5, **options):
        pass


@pytest.mark.parametrize(
    "door",
    [_trio_door, _asyncio_door, _asyncio_class, _thread_door],
    ids=lambda door: door.__name__,
)
def test_every_door_refuses_a_misspelled_option_at_run_time(
    door: Callable[..., None],
) -> None:
    door(**REQUIRED, sweep_interval_s=None)  # the right name opens and closes
    with pytest.raises(TypeError, match="sweep_intervl_s"):
        door(**REQUIRED, sweep_intervl_s=None)


def test_the_drop_in_refuses_a_misspelled_option_at_run_time() -> None:
    with pytest.raises(TypeError, match="replay_max_bytes_per_sesion"):
        DuplexSessionAttachmentRegistry(replay_ttl_s=60, replay_max_bytes_per_sesion=1024)  # type: ignore[call-arg]
