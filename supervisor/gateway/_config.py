"""The gateway's settings and counters: everything ``duplex-supervisor serve`` takes."""

from __future__ import annotations

import ipaddress
import math
from dataclasses import dataclass, field

from supervisor.gateway._flag_spec import flag

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
    "gc_young_threshold",
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
    """Everything ``duplex-supervisor serve`` takes as flags: a field with ``flag(...)``
    metadata is one (its help and default live here; ``--help`` lists them in field order)."""

    host: str = field(
        default="127.0.0.1",
        metadata=flag("interface to bind (default {default})", group="network"),
    )
    port: int = field(
        default=8765,
        metadata=flag(
            "TCP port 0..65535, 0 for any (default {default})", group="network", parse="port"
        ),
    )
    metrics_port: int | None = field(
        default=None,
        metadata=flag(
            "serve /metrics, /healthz and /readyz on this port of --metrics-host (and "
            "/metrics no longer on --port): the port for the scraper, not for clients "
            "(default: none, all on --port)",
            group="network",
            parse="port",
        ),
    )
    metrics_host: str = field(
        default="127.0.0.1",
        metadata=flag("the address of --metrics-port (default {default})", group="network"),
    )
    path: str = field(
        default="/v1",
        metadata=flag("the WebSocket endpoint's path (default {default})", group="network"),
    )
    max_frame_bytes: int = field(
        default=65_536,
        metadata=flag(
            "largest client frame answered normally; units as 64KiB or 1MB are taken "
            "(default {default} = {default_size})",
            group="limits",
            metavar="BYTES",
            parse="bytes",
        ),
    )
    handshake_timeout_s: float = field(
        default=5.0,
        metadata=flag(
            "seconds a new connection has for its TLS handshake and upgrade request, then "
            "again for its first frame (error 'handshake_timeout', close 4408) (default {default})",
            group="limits",
        ),
    )
    ping_interval_s: float = field(
        default=10.0,
        metadata=flag("seconds between pings to each client (default {default})", group="limits"),
    )
    idle_timeout_s: float = field(
        default=30.0,
        metadata=flag(
            "a client that misses a pong this long is detached (default {default})",
            group="limits",
        ),
    )
    max_sessions: int = field(
        default=10_000,
        metadata=flag(
            "sessions held at once, attached or not; one more session.open is answered "
            "error 'overloaded' and closed 4503 (default {default})",
            group="limits",
        ),
    )
    max_sessions_per_address: int = field(
        default=256,
        metadata=flag(
            "sessions opened from one client address and not yet ended; one more "
            "session.open from it is answered 'too_many_sessions' and closed 4429 "
            "(default {default})",
            group="limits",
        ),
    )
    max_connections: int = field(
        default=10_000,
        metadata=flag(
            "TCP connections served at once; more are answered HTTP 503 before the "
            "upgrade (with TLS: closed) (default {default})",
            group="limits",
        ),
    )
    max_connections_per_address: int = field(
        default=256,
        metadata=flag(
            "TCP connections from one client address at once; more are answered HTTP 429 "
            "before the upgrade (with TLS: closed) (default {default})",
            group="limits",
        ),
    )
    max_inputs_in_flight: int = field(
        default=8,
        metadata=flag(
            "answers a session may have on their way at once; an input past it gets "
            "error 'busy' (not answered, not remembered: send it again later) "
            "(default {default})",
            group="limits",
        ),
    )
    max_inputs_per_second: float = field(
        default=20.0,
        metadata=flag(
            "inputs a connection may send per second, in bursts of as many; an input past "
            "it gets error 'rate_limited' (not answered, not remembered) (default {default})",
            group="limits",
            metavar="RATE",
        ),
    )
    #: Sequenced client events (``client_seq``) a connection may send: events
    #: and bytes a second (a stream's rate: 50 audio chunks a second fit twice).
    max_client_events_per_second: float = field(
        default=100.0,
        metadata=flag(
            "sequenced client events (client_seq) a connection may send per second, in "
            "bursts of as many; past it: error 'rate_limited', the event not taken "
            "(default {default})",
            group="limits",
            metavar="RATE",
        ),
    )
    max_client_bytes_per_second: float = field(
        default=65_536.0,
        metadata=flag(
            "bytes of client events a connection may send per second (whole messages), in "
            "bursts of as many; past it: error 'rate_limited' (default {default})",
            group="limits",
            metavar="BYTES",
        ),
    )
    #: ``client_ack`` goes out after this many accepted client events, or this
    #: long after the first one not yet acked, whichever comes first.
    client_ack_every: int = field(
        default=10,
        metadata=flag(
            "send client_ack after this many accepted client events (default {default})",
            group="limits",
            metavar="N",
        ),
    )
    client_ack_interval_s: float = field(
        default=0.2,
        metadata=flag(
            "or this long after the first accepted client event not yet acked (default {default})",
            group="limits",
            metavar="SECONDS",
        ),
    )
    close_timeout_s: float = field(
        default=5.0,
        metadata=flag(
            "seconds a close handshake may take before the TCP connection is aborted, "
            "whatever the peer does (default {default})",
            group="limits",
        ),
    )
    disconnect_grace_s: float | None = field(
        default=60.0,
        metadata=flag(
            "seconds a detached session waits for a resume, or 'none' to keep detached "
            "sessions until a client closes them (default {default})",
            group="limits",
            parse="seconds|none",
        ),
    )
    #: The registry's own default (``DEFAULT_PASSIVATE_AFTER_S``), spelled out:
    #: the pure gateway modules import no actor runtime.
    passivate_after_s: float | None = field(
        default=30.0,
        metadata=flag(
            "a session detached and idle this long is parked (checked once a second): "
            "its thread ends, its state is kept as data and its next message or resume wakes "
            "it; 0: at the next check, 'none': never (default {default})",
            group="limits",
            metavar="SECONDS|none",
            parse="seconds>=0|none",
        ),
    )
    replay_ttl_s: float = field(
        default=120.0,
        metadata=flag(
            "seconds an unacknowledged event stays replayable (default {default})",
            group="limits",
        ),
    )
    replay_max_bytes_per_session: int = field(
        default=4 << 20,
        metadata=flag(
            "journal bytes per session before it overflows; units as 4MiB or 512KiB are "
            "taken (default {default_size})",
            group="limits",
            name="replay-max-bytes",
            metavar="BYTES",
            parse="bytes",
        ),
    )
    send_timeout_s: float = field(
        default=10.0,
        metadata=flag(
            "a send to a client taking longer gives that socket up (default {default})",
            group="limits",
        ),
    )
    resume_failures_allowed: int = field(
        default=5,
        metadata=flag(
            "failed resumes allowed per address per window (default {default})",
            group="limits",
            name="resume-failures",
        ),
    )
    resume_failure_window_s: float = field(
        default=60.0,
        metadata=flag(
            "seconds of the resume-failure window (default {default})",
            group="limits",
            name="resume-window",
        ),
    )
    secret_failures_allowed: int = field(
        default=5,
        metadata=flag(
            "wrong secrets allowed per address per window; then session.open from that "
            "address is answered 'secret_throttled' and closed 4429 (default {default})",
            group="limits",
            name="secret-failures",
        ),
    )
    secret_failure_window_s: float = field(
        default=60.0,
        metadata=flag(
            "seconds of the wrong-secret window (default {default})",
            group="limits",
            name="secret-window",
        ),
    )
    throttle_max_addresses: int = field(
        default=10_000,
        metadata=flag(
            "addresses each failure throttle remembers at most; the one whose last "
            "failure is oldest is forgotten first, and any is forgotten once its window "
            "passed (default {default})",
            group="limits",
            name="throttle-addresses",
        ),
    )
    session_resume_failures_allowed: int = field(
        default=5,
        metadata=flag(
            "failed resumes allowed per session (from any address) per window; a resume "
            "with the right token is never refused (default {default})",
            group="limits",
            name="session-resume-failures",
        ),
    )
    session_resume_failure_window_s: float = field(
        default=60.0,
        metadata=flag(
            "seconds of the per-session resume-failure window (default {default})",
            group="limits",
            name="session-resume-window",
        ),
    )
    log_interval_s: float = field(
        default=10.0,
        metadata=flag(
            "at most one log line of each kind (refused connections, failed handlers, "
            "shed connections...) per this many seconds; the rest are counted in one summary "
            "line (default {default})",
            group="serve",
        ),
    )
    gc_young_threshold: int = field(
        default=50_000,
        metadata=flag(
            "objects allocated between the garbage collector's young collections while "
            "the gateway runs; the interpreter's own is 700, under which what events in "
            "flight make is promoted and full collections eat the CPU (default {default})",
            group="serve",
        ),
    )
    max_inputs_per_session: int = field(
        default=100_000,
        metadata=flag(
            "distinct input ids a session answers in its life, each remembered so a "
            "repeat is never answered twice; a new id past it gets error 'input_limit' "
            "(default {default})",
            group="demo engine",
            metavar="N",
        ),
    )
    demo_page: bool = field(
        default=False,
        metadata=flag(
            "serve a page at / that watches a session of the browser client resume through "
            "cuts (live stream, counters, an input box, a cut button); off by default",
            group="page and TLS",
        ),
    )
    tls_cert: str | None = field(
        default=None,
        metadata=flag(
            "PEM certificate: serve wss:// (needs --tls-key)", group="page and TLS", parse="str"
        ),
    )
    tls_key: str | None = field(
        default=None,
        metadata=flag("PEM private key for --tls-cert", group="page and TLS", parse="str"),
    )
    #: Run the ``authenticate`` hook once the opening frame arrived, with its
    #: ``secret`` as ``Handshake.credential`` (a browser's way: no header, no
    #: secret in a URL); else at the upgrade, before any frame.
    authenticate_on_first_frame: bool = field(
        default=False,
        metadata=flag(
            "run the --authenticate hook once the opening frame arrived, with the frame's "
            "secret as handshake.credential (browsers: no header, no secret in the URL)",
            group="authenticate",
        ),
    )
    # Not flags of their own: the secret (--secret-file or the environment),
    # and lists (repeatable flags, a list where the field holds a tuple).
    shared_secret: str | None = field(default=None, repr=False)
    allowed_origins: tuple[str, ...] = ()
    #: Proxies (addresses or networks) whose ``X-Forwarded-For`` is believed.
    trusted_proxies: tuple[str, ...] = ()

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
