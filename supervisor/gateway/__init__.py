"""The gateway: resumable sessions over WebSocket, as a server or an ASGI app.

Three layers: a sans-I/O protocol core (`supervisor.gateway._core`), thin
shells (the trio server `serve_gateway`, the ASGI app `GatewayApp`),
and the engine and auth behind small protocols (`Engine`,
``authenticate``) that you implement.
"""

from __future__ import annotations

from supervisor.gateway._auth import Handshake, Unauthorized, bearer_secret
from supervisor.gateway._config import GatewayConfig
from supervisor.gateway._engine import (
    ClientEvent,
    DemoEngine,
    Engine,
    EngineConfig,
    EngineSession,
    RealtimeEngine,
    SessionEnded,
)
from supervisor.gateway._server import Gateway, serve_gateway
from supervisor.gateway.asgi import GatewayApp

__all__ = [
    "ClientEvent",
    "DemoEngine",
    "Engine",
    "EngineConfig",
    "EngineSession",
    "Gateway",
    "GatewayApp",
    "GatewayConfig",
    "Handshake",
    "RealtimeEngine",
    "SessionEnded",
    "Unauthorized",
    "bearer_secret",
    "serve_gateway",
]
