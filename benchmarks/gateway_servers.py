"""Which server ``serve --server`` should default to: the same load on each, one run.

``python -m benchmarks.gateway_servers [--clients N] [--inputs N] [--seconds S]``

Per server, a real ``duplex-supervisor serve`` process on loopback (demo
engine answering each input with 3 deltas and a ``response.done``, no
background stream) and ``--clients`` wire clients in this process, each
sending an input and waiting for its ``response.done`` (acking as it goes),
``--inputs`` times. Reported: answered inputs per second (whole crowd), p50
and p99 round trip, and each server's throughput as a ratio of the fastest.
One run, so treat differences under ~10 % as noise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import trio

from supervisor._extras import MissingExtraError, require
from supervisor.cli._wire_client import WireClient
from supervisor.gateway._servers import NEEDS

SERVERS = ("trio", "asgi-uvicorn", "asgi-hypercorn")


async def _client(url: str, inputs: int, latencies: list[float]) -> None:
    ws = await WireClient.connect(url)
    try:
        await ws.send_json({"type": "session.open"})
        await ws.receive_json()
        last = 0
        for n in range(inputs):
            started = trio.current_time()
            await ws.send_json({"type": "input", "client_event_id": f"i{n}", "text": "hi"})
            while True:
                frame = await ws.receive_json()
                seq = frame.get("server_event_seq")
                if isinstance(seq, int):
                    last = seq
                if frame.get("type") == "response.done":
                    break
            latencies.append(trio.current_time() - started)
            await ws.send_json({"type": "ack", "server_event_seq": last})
        await ws.send_json({"type": "session.close"})
    finally:
        await ws.cut()


async def _measure(server: str, clients: int, inputs: int) -> tuple[float, list[float]]:
    command = [sys.executable, "-m", "supervisor", "serve", "--port", "0", "--server", server]
    command += ["--event-rate", "0", "--max-inputs-per-second", "1e9", "--log-level", "info"]
    command += ["--max-connections-per-address", "100000", "--max-sessions-per-address", "100000"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = await trio.lowlevel.open_process(command, stderr=subprocess.PIPE, env=env)
    assert process.stderr is not None
    try:
        log = b""
        while b"listening on" not in log or not log.endswith(b"\n"):
            chunk = await process.stderr.receive_some()
            assert chunk, log
            log += chunk
        url = next(ln for ln in log.decode().splitlines() if "listening on" in ln).split()[-1]
        latencies: list[float] = []
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            for _ in range(clients):
                nursery.start_soon(_client, url, inputs, latencies)
        return trio.current_time() - started, latencies
    finally:
        process.terminate()
        with trio.CancelScope(shield=True):
            await process.wait()
            await process.stderr.aclose()


async def main(clients: int, inputs: int) -> None:
    rates: dict[str, float] = {}
    rows: list[str] = []
    for server in SERVERS:
        elapsed, latencies = await _measure(server, clients, inputs)
        latencies.sort()
        rates[server] = len(latencies) / elapsed
        p50 = latencies[len(latencies) // 2] * 1000
        p99 = latencies[int(len(latencies) * 0.99)] * 1000
        rows.append(
            f"{server:15} {rates[server]:8.0f} inputs/s  p50 {p50:6.2f} ms  p99 {p99:6.2f} ms"
        )
    best = max(rates.values())
    for server, row in zip(SERVERS, rows, strict=True):
        print(f"{row}  {rates[server] / best:5.2f}x of the fastest")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=20)
    parser.add_argument("--inputs", type=int, default=200)
    args = parser.parse_args()
    try:  # it runs every server: say what is missing before the first one starts
        for module in NEEDS.values():
            require(module, "python -m benchmarks.gateway_servers")
    except MissingExtraError as exc:
        sys.exit(f"{exc}")
    trio.run(main, args.clients, args.inputs)
