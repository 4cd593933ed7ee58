"""Per-peer resume throttling, and a silent peer detached after the idle timeout."""

from __future__ import annotations

import contextlib
import logging

import pytest
import trio

from supervisor.cli._wire_client import WireClosedError
from supervisor.gateway._protocol import CLOSE_CODES
from supervisor.gateway._server import GatewayConfig
from tests.gateway_support import (
    LIMIT,
    Opened,
    errors,
    read_until,
    read_until_closed,
    running_gateway,
    seqs,
)

ATTACKER = "127.0.0.2"
OWNER = "127.0.0.1"


async def test_failed_resumes_throttle_that_address_only(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="duplex_supervisor")
    config = GatewayConfig(port=0, resume_failures_allowed=3, resume_failure_window_s=60)
    with trio.fail_after(LIMIT):
        async with running_gateway(config) as harness:
            opened = await harness.open()
            first = await read_until(opened.client, "response.output_text.delta")
            await opened.client.cut()
            await harness.wait_detached(opened.session_id)
            sid = opened.session_id

            async def attempt(token: str, address: str) -> tuple[list[object], int | None]:
                client = await harness.resume(sid, token, seqs(first)[-1], local_address=address)
                frames, closed = await read_until_closed(client)
                return errors(frames), closed.code

            # Three failures are allowed; from then on that address is throttled.
            for _ in range(3):
                assert await attempt("guessed-token", ATTACKER) == (
                    ["invalid_resume_token"],
                    CLOSE_CODES["invalid_resume_token"],
                )
            throttled = (["resume_throttled"], CLOSE_CODES["resume_throttled"])
            assert throttled[1] == 4429
            assert await attempt("guessed-token", ATTACKER) == throttled

            # The right token is never refused by the throttle (it is checked
            # first: one SHA-256), even from the throttled address.
            client = await harness.resume(
                sid, opened.token, seqs(first)[-1], local_address=ATTACKER
            )
            resumed = await client.receive_json()
            assert resumed["type"] == "session.resumed", resumed
            assert resumed["attachment_generation"] == 2
            more = await read_until(client, "response.output_text.delta")
            assert seqs(more)[0] == seqs(first)[-1] + 1
            assert harness.gateway.counters.errors == {
                "invalid_resume_token": 3,
                "resume_throttled": 1,
            }
            # The attacker stays throttled for wrong tokens while the window lasts.
            assert await attempt("guessed-again", ATTACKER) == throttled
            assert await harness.gateway.registry.has_attachment(sid)
    # Refused resumes are logged with the client's address, never a token.
    lines = [r.getMessage() for r in caplog.records]
    assert f"refused a resume from {ATTACKER}: invalid_resume_token" in lines, lines
    assert not any("guessed" in line or opened.token in line for line in lines), lines


async def test_failed_resumes_of_one_session_from_many_addresses_throttle_it() -> None:
    config = GatewayConfig(port=0, session_resume_failures_allowed=2, resume_failures_allowed=100)
    with trio.fail_after(LIMIT):
        async with running_gateway(config) as harness:
            opened = await harness.open()
            await opened.client.cut()
            await harness.wait_detached(opened.session_id)
            codes = []
            for n in range(3):
                address = f"127.0.0.{n + 2}"
                client = await harness.resume(opened.session_id, "bad", 0, local_address=address)
                frames, closed = await read_until_closed(client)
                codes.append((errors(frames), closed.code))
            assert codes == [
                (["invalid_resume_token"], 4403),
                (["invalid_resume_token"], 4403),
                (["resume_throttled"], 4429),
            ]
            # Another session is not touched, and the owner's token still works.
            other = await harness.open()
            assert other.generation == 1
            client = await harness.resume(opened.session_id, opened.token, 0)
            assert (await client.receive_json())["type"] == "session.resumed"


async def test_unknown_sessions_are_not_failed_resumes() -> None:
    # After a restart every client resumes a session the server no longer
    # knows: that must not lock their address out.
    config = GatewayConfig(port=0, resume_failures_allowed=2)
    with trio.fail_after(LIMIT):
        async with running_gateway(config) as harness:
            codes = []
            for n in range(4):
                client = await harness.resume(f"sess_guess{n}", "t", 0, local_address=ATTACKER)
                frames, closed = await read_until_closed(client)
                codes.append((errors(frames), closed.code))
            assert codes == [(["unknown_session"], 4404)] * 4
            assert harness.gateway.throttled_addresses() == 0


async def _silent(opened: Opened) -> None:
    """Read frames and never answer a ping, like a peer whose link died half-way."""
    # The gateway closes the socket once it detached it; a peer really gone
    # would never read that close, and the session does not depend on it.
    with contextlib.suppress(WireClosedError):
        while True:
            await opened.client.receive_json()


@pytest.mark.parametrize("reads", [True, False], ids=["reads_no_pongs", "reads_nothing"])
async def test_a_silent_peer_is_detached_after_the_idle_timeout(reads: bool) -> None:
    # The talker must answer each ping within the idle timeout: 1 s leaves a
    # loaded machine room for that, and the silent peer is still gone soon.
    config = GatewayConfig(port=0, ping_interval_s=0.2, idle_timeout_s=1.0)
    with trio.fail_after(LIMIT):
        async with running_gateway(config) as harness:
            talker = await harness.neighbour()  # answers pings: stays attached
            silent = await harness.open(answer_pings=False)
            assert await harness.gateway.registry.has_attachment(silent.session_id)
            if reads:
                harness.nursery.start_soon(_silent, silent)
            await harness.wait_detached(silent.session_id)
            # The client never closed its socket; the gateway noticed on its own.
            # Detached, not closed: the session waits for a resume.
            assert silent.session_id in harness.gateway.registry.session_ids()
            # A session with a live peer is left alone for longer than that.
            await trio.sleep(1.2)
            assert await harness.gateway.registry.has_attachment(talker.opened.session_id)
            await talker.check_undisturbed()
            # The silent one resumes from where it was, losing nothing.
            client = await harness.resume(silent.session_id, silent.token, 0)
            resumed = await client.receive_json()
            assert resumed["type"] == "session.resumed", resumed
            replay = await read_until(client, "response.output_text.delta")
            assert seqs(replay) == [1]
