"""Helpers for the soak, fuzz and security tests (no tests here).

* `serving` runs a real gateway on 127.0.0.1, port 0, in the current
  trio run; ``faults=`` hands a `FaultPlan` to the gateway's registry.
* `BackgroundGateway` runs the same in a thread of its own, with a
  neighbouring session that streams through the whole test and records every
  frame, for tests (hypothesis) that drive clients with a ``trio.run`` each.
* `rss_bytes` and `sample_resources` measure flatness;
  `record_figures` writes a test's figures to ``$DUPLEX_FIGURES``.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import itertools
import json
import os
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import trio

from supervisor._faults import FaultPlan
from supervisor.cli._wire_client import WireClient, WireClosedError
from supervisor.gateway._engine import EngineConfig
from supervisor.gateway._server import Gateway, GatewayConfig, serve_gateway

Frame = dict[str, object]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def record_figures(test: str, figures: dict[str, object]) -> None:
    """Append ``{"test": ..., **figures}`` as a JSON line to ``$DUPLEX_FIGURES``, if set."""
    path = os.environ.get("DUPLEX_FIGURES")
    if path:
        line = {"test": test, "date": datetime.datetime.now(datetime.UTC).isoformat(), **figures}
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(line, default=str) + "\n")


def rss_bytes() -> int:
    """This process's resident set, from ``/proc/self/statm`` (pages -> bytes)."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * _PAGE


@dataclass(frozen=True, slots=True)
class Sample:
    at_s: float
    rss: int
    threads: int


async def sample_resources(samples: list[Sample], interval_s: float = 1.0) -> None:
    """Append a `Sample` every ``interval_s`` until cancelled."""
    start = trio.current_time()
    while True:
        samples.append(Sample(trio.current_time() - start, rss_bytes(), threading.active_count()))
        await trio.sleep(interval_s)


def _addresses() -> Iterator[str]:
    for n in itertools.count():
        yield f"127.1.{n // 250 % 250}.{n % 250 + 1}"


_ADDRESSES = _addresses()


def fresh_address() -> str:
    """A loopback source address not used before in this process (127.1.x.y)."""
    return next(_ADDRESSES)


def seq_of(frame: Frame) -> int | None:
    seq = frame.get("server_event_seq")
    return seq if isinstance(seq, int) and not isinstance(seq, bool) else None


def seqs(frames: list[Frame]) -> list[int]:
    return [s for s in map(seq_of, frames) if s is not None]


def contiguous(first: int, numbers: list[int]) -> bool:
    return numbers == list(range(first, first + len(numbers)))


@contextlib.asynccontextmanager
async def serving(
    config: GatewayConfig | None = None,
    *,
    engine: EngineConfig | None = None,
    faults: FaultPlan | None = None,
) -> AsyncIterator[Gateway]:
    """A gateway on a free loopback port until the block ends."""
    config = config or GatewayConfig(port=0)
    assert config.port == 0
    async with trio.open_nursery() as nursery:
        gateway: Gateway = await nursery.start(
            functools.partial(serve_gateway, config, engine_config=engine, faults=faults)
        )
        try:
            yield gateway
        finally:
            nursery.cancel_scope.cancel()


async def read_until_closed(client: WireClient) -> tuple[list[Frame], WireClosedError]:
    frames: list[Frame] = []
    while True:
        try:
            frames.append(await client.receive_json())
        except WireClosedError as closed:
            return frames, closed


async def open_session(url: str, **connect: Any) -> tuple[WireClient, Frame]:
    """Connect and open a session: the client and its ``session.created``."""
    client = await WireClient.connect(url, **connect)
    try:
        await client.send_json({"type": "session.open"})
        created = await client.receive_json()
    except BaseException:
        await client.cut()
        raise
    assert created.get("type") == "session.created", created
    return client, created


@dataclass(slots=True)
class Neighbour:
    """A session streaming beside the mischief; every frame it got, in order."""

    session_id: str = ""
    frames: list[Frame] = field(default_factory=list)
    ended: BaseException | None = None

    def check(self) -> list[int]:
        """Its stream so far: 1, 2, 3, ... with no error frame and no end."""
        frames = list(self.frames)
        assert self.ended is None, f"the neighbour's connection ended: {self.ended!r}"
        assert [f for f in frames if seq_of(f) is None] == [], frames[:5]
        received = seqs(frames)
        assert contiguous(1, received), received
        return received


class BackgroundGateway:
    """A gateway (and a `Neighbour`) served by ``trio.run`` in a thread.

    ``with BackgroundGateway(config) as gw:`` -- ``gw.url`` to connect;
    ``gw.call(fn)`` runs a sync function on the gateway's loop (to read its
    registry); leaving stops it and re-raises whatever crashed it.
    """

    def __init__(self, config: GatewayConfig, engine: EngineConfig | None = None) -> None:
        self._config = config
        self._engine = engine
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="fuzz-gateway", daemon=True)
        self._token: trio.lowlevel.TrioToken | None = None
        self._scope: trio.CancelScope | None = None
        self.gateway: Gateway | None = None
        self.crashed: BaseException | None = None
        self.neighbour = Neighbour()

    @property
    def url(self) -> str:
        assert self.gateway is not None
        return self.gateway.url

    def alive(self) -> bool:
        return self._thread.is_alive() and self.crashed is None

    def call(self, fn: Callable[[], Any]) -> Any:
        assert self._token is not None
        return trio.from_thread.run_sync(fn, trio_token=self._token)

    def __enter__(self) -> BackgroundGateway:
        self._thread.start()
        assert self._ready.wait(30), "the gateway did not come up"
        if self.crashed is not None:
            raise self.crashed
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._thread.is_alive() and self._scope is not None:
            with contextlib.suppress(trio.RunFinishedError):
                self.call(self._scope.cancel)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the gateway did not stop"
        if self.crashed is not None:
            raise AssertionError("the gateway crashed") from self.crashed

    def _main(self) -> None:
        try:
            trio.run(self._serve)
        except BaseException as exc:  # recorded: the test thread raises it
            self.crashed = exc
        finally:
            self._ready.set()

    async def _serve(self) -> None:
        self._token = trio.lowlevel.current_trio_token()
        with trio.CancelScope() as self._scope:
            async with serving(self._config, engine=self._engine) as gateway:
                self.gateway = gateway
                client, created = await open_session(gateway.url)
                self.neighbour.session_id = str(created["session_id"])
                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._listen, client)
                        self._ready.set()
                finally:
                    with trio.CancelScope(shield=True):
                        await client.cut()

    async def _listen(self, client: WireClient) -> None:
        try:
            while True:
                self.neighbour.frames.append(await client.receive_json())
        except (WireClosedError, trio.BrokenResourceError) as exc:
            self.neighbour.ended = exc


@contextlib.contextmanager
def patched(obj: object, name: str, wrap: Callable[[Any], Any]) -> Iterator[None]:
    """``obj.name = wrap(obj.name)`` for the block."""
    original = getattr(obj, name)
    setattr(obj, name, wrap(original))
    try:
        yield
    finally:
        setattr(obj, name, original)
