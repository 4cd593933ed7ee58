"""A resume the client never confirmed does not lock the client out.

The server counts ``session.resumed`` as delivered once its send returned,
but a link that drops right then may never carry it to the client, who is
left holding only the token it presented. Until the client's first frame
on the new connection, the gateway treats the resume as unconfirmed; if
the connection ends first, the resume is rolled back, so the presented
token works once more (and the rotated one, if the client did get it).
"""

from __future__ import annotations

import trio

from tests.gateway_support import LIMIT, read_until, running_gateway, seqs


async def test_a_resume_cut_before_the_client_spoke_leaves_the_presented_token_usable() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway() as harness:
            opened = await harness.open()
            first = await read_until(opened.client, "response.output_text.delta")
            last = seqs(first)[-1]
            await opened.client.cut()
            await harness.wait_detached(opened.session_id)

            # Resume, then drop before reading session.resumed or sending a frame.
            lost = await harness.resume(opened.session_id, opened.token, last)
            while not await harness.gateway.registry.has_attachment(opened.session_id):
                await trio.sleep(0.01)
            await lost.cut()
            await harness.wait_detached(opened.session_id)

            # The client only ever saw its first token: it must still get in.
            client = await harness.resume(opened.session_id, opened.token, last)
            resumed = await client.receive_json()
            assert resumed["type"] == "session.resumed", resumed
            more = await read_until(client, "response.output_text.delta")
            assert seqs(more)[0] == last + 1


async def test_a_confirmed_resume_retires_the_presented_token() -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway() as harness:
            opened = await harness.open()
            first = await read_until(opened.client, "response.output_text.delta")
            last = seqs(first)[-1]
            await opened.client.cut()
            await harness.wait_detached(opened.session_id)

            client = await harness.resume(opened.session_id, opened.token, last)
            resumed = await client.receive_json()
            assert resumed["type"] == "session.resumed"
            more = await read_until(client, "response.output_text.delta")
            # The client speaks on the new connection: the resume is confirmed.
            await client.send_json({"type": "ack", "server_event_seq": seqs(more)[-1]})
            await read_until(client, "response.output_text.delta")
            await client.cut()
            await harness.wait_detached(opened.session_id)

            stale = await harness.resume(opened.session_id, opened.token, seqs(more)[-1])
            refused = await stale.receive_json()
            assert refused["type"] == "error"
            assert refused["code"] == "invalid_resume_token"
