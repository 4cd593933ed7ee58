"""The socket uvicorn listens on gives connections with Nagle's algorithm off.

asyncio turns TCP_NODELAY on for an accepted connection only when its socket
says ``proto == IPPROTO_TCP``; a socket made as ``socket.socket(AF_INET)``
says 0, so the gateway's frames of one answer waited for the client's
delayed ACK (~40 ms a round trip under uvicorn).
"""

from __future__ import annotations

import asyncio
import socket

from supervisor.gateway._servers import listening_socket


def test_connections_accepted_from_the_listening_socket_have_nagle_off() -> None:
    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        class Probe(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                sock = transport.get_extra_info("socket")
                accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
                transport.close()

        sock = listening_socket("127.0.0.1", 0)
        # How uvicorn serves the sockets it is given.
        server = await asyncio.get_running_loop().create_server(Probe, sock=sock)
        try:
            port = sock.getsockname()[1]
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                return await asyncio.wait_for(accepted, 5)
            finally:
                writer.close()
        finally:
            server.close()
            await server.wait_closed()

    assert asyncio.run(main()) != 0
