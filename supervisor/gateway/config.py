"""The gateway's settings and counters: everything ``duplex-supervisor serve`` takes."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["GatewayConfig", "GatewayCounters"]

_POSITIVE = (
    "handshake_timeout_s",
    "ping_interval_s",
    "idle_timeout_s",
    "close_timeout_s",
    "max_sessions",
    "max_sessions_per_address",
    "max_connections",
    "max_connections_per_address",
    "max_inputs_in_flight",
    "max_inputs_per_second",
    "resume_failures_allowed",
    "resume_failure_window_s",
    "secret_failures_allowed",
    "secret_failure_window_s",
    "throttle_max_addresses",
    "log_interval_s",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig:
    """Everything ``duplex-supervisor serve`` takes as flags."""

    host: str = "127.0.0.1"
    port: int = 8765
    path: str = "/v1"
    max_frame_bytes: int = 65_536
    handshake_timeout_s: float = 5.0
    ping_interval_s: float = 10.0
    idle_timeout_s: float = 30.0
    max_sessions: int = 10_000
    max_sessions_per_address: int = 256
    max_connections: int = 10_000
    max_connections_per_address: int = 256
    max_inputs_in_flight: int = 8
    max_inputs_per_second: float = 20.0
    disconnect_grace_s: float | None = 60.0
    replay_ttl_s: float = 120.0
    replay_max_bytes_per_session: int = 4 << 20
    send_timeout_s: float = 10.0
    shared_secret: str | None = field(default=None, repr=False)
    allowed_origins: tuple[str, ...] = ()
    tls_cert: str | None = None
    tls_key: str | None = None
    close_timeout_s: float = 5.0
    resume_failures_allowed: int = 5
    resume_failure_window_s: float = 60.0
    secret_failures_allowed: int = 5
    secret_failure_window_s: float = 60.0
    throttle_max_addresses: int = 10_000
    log_interval_s: float = 10.0

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError("path must start with '/'")
        if self.max_frame_bytes < 256:
            raise ValueError("max_frame_bytes must be at least 256")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        for name in _POSITIVE:
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")


@dataclass(slots=True)
class GatewayCounters:
    connections: int = 0
    sessions_opened: int = 0
    resumes: int = 0
    replaced: int = 0
    #: Resumes rolled back because the connection ended before the client spoke.
    unconfirmed_resumes: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    #: Connections refused before the upgrade, by the cap they hit
    #: (``total``, ``address``); ``descriptors``: shed for want of descriptors.
    refused: dict[str, int] = field(default_factory=dict)
