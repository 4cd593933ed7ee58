"""The gateway's settings and counters: everything ``duplex-supervisor serve`` takes."""

from __future__ import annotations

import ipaddress
import math
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
    "session_resume_failures_allowed",
    "session_resume_failure_window_s",
    "secret_failures_allowed",
    "secret_failure_window_s",
    "throttle_max_addresses",
    "log_interval_s",
    "max_inputs_per_session",
    "max_client_events_per_second",
    "max_client_bytes_per_second",
    "client_ack_every",
    "client_ack_interval_s",
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
    #: A session detached and idle this long is parked (no thread); None: never.
    #: The registry's own default (``DEFAULT_PASSIVATE_AFTER_S``), spelled out:
    #: the pure gateway modules import no actor runtime.
    passivate_after_s: float | None = 30.0
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
    #: Failed resumes of one session (from anywhere) per window; a resume
    #: with the right token is never refused by either throttle.
    session_resume_failures_allowed: int = 5
    session_resume_failure_window_s: float = 60.0
    #: Proxies (addresses or networks) whose ``X-Forwarded-For`` is believed.
    trusted_proxies: tuple[str, ...] = ()
    #: Answers a session may have on their way, and distinct input ids it
    #: answers in its life (each remembered so a repeat is never answered twice).
    max_inputs_per_session: int = 100_000
    #: Run the ``authenticate`` hook once the opening frame arrived, with its
    #: ``secret`` as ``Handshake.credential`` (a browser's way: no header, no
    #: secret in a URL); else at the upgrade, before any frame.
    authenticate_on_first_frame: bool = False
    #: Serve ``/metrics``, ``/healthz`` and ``/readyz`` on this port of
    #: ``metrics_host`` (0: any free one), and ``/metrics`` no longer on ``port``.
    metrics_port: int | None = None
    metrics_host: str = "127.0.0.1"
    #: Sequenced client events (``client_seq``) a connection may send: events
    #: and bytes a second (a stream's rate: 50 audio chunks a second fit twice).
    max_client_events_per_second: float = 100.0
    max_client_bytes_per_second: float = 65_536.0
    #: ``client_ack`` goes out after this many accepted client events, or this
    #: long after the first one not yet acked, whichever comes first.
    client_ack_every: int = 10
    client_ack_interval_s: float = 0.2
    #: Serve the demo page at ``/`` (and the browser client it loads): off by default.
    demo_page: bool = False

    def __post_init__(self) -> None:
        if not self.path.startswith("/"):
            raise ValueError("path must start with '/'")
        if self.max_frame_bytes < 256:
            raise ValueError("max_frame_bytes must be at least 256")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("TLS needs both a certificate and a key")
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise ValueError(f"trusted_proxies: {proxy!r} is no address or network") from None
        if not 0 <= self.port <= 65_535:
            raise ValueError(f"port must be within 0..65535, got {self.port}")
        if self.metrics_port is not None and not 0 <= self.metrics_port <= 65_535:
            raise ValueError(f"metrics_port must be within 0..65535, got {self.metrics_port}")
        after = self.passivate_after_s
        if after is not None and not (after >= 0 and math.isfinite(after)):
            raise ValueError("passivate_after_s must be None or a finite number >= 0")
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
    #: Resumes by outcome: ``resumed`` or the error code that refused them.
    resume_outcomes: dict[str, int] = field(default_factory=dict)
    #: Resumes refused ``journal_gap``, by what dropped the first missing event.
    gap_reasons: dict[str, int] = field(default_factory=dict)
    #: Connections refused before the upgrade, by the cap they hit
    #: (``total``, ``address``); ``descriptors``: shed for want of descriptors.
    refused: dict[str, int] = field(default_factory=dict)
    #: Sequenced client events accepted (handed to the engine), and repeats
    #: (``client_seq`` at or below the last accepted) dropped.
    client_events_accepted: int = 0
    client_events_repeated: int = 0
