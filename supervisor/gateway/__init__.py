"""A WebSocket gateway in front of the trio registry, a demo engine and chaos clients."""

from __future__ import annotations

from supervisor.gateway.engine import DemoEngine, EngineConfig
from supervisor.gateway.server import Gateway, GatewayConfig, serve_gateway

__all__ = ["DemoEngine", "EngineConfig", "Gateway", "GatewayConfig", "serve_gateway"]
