"""What a chaos run is given and what it answers (`supervisor.cli._chaos`
runs the clients): `ChaosConfig`, the gateway processes it aims at
(`Targets`), each client's `ClientReport` and their `ChaosReport`."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from supervisor.gateway._flag_spec import flag

__all__ = [
    "STORE_GIVE_UP_S",
    "STORE_RETRY_MAX_S",
    "STORE_RETRY_S",
    "ChaosConfig",
    "ChaosReport",
    "ClientReport",
    "Targets",
    "total_of",
]

#: A ``store_unavailable`` answer is tried again after this, doubling up to
#: `STORE_RETRY_MAX_S`; a client gives up `STORE_GIVE_UP_S` after the run's end.
STORE_RETRY_S = 0.1
STORE_RETRY_MAX_S = 2.0
STORE_GIVE_UP_S = 30.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ChaosConfig:
    clients: int = 20
    duration_s: float = 10.0
    drop_rate: float = field(
        default=0.5,
        metadata=flag(
            "chance per second that a client cuts its TCP connection (default {default})",
            group="chaos clients",
            metavar="PER_SECOND",
            parse="non-negative",
        ),
    )
    max_reconnect_delay_s: float = field(
        default=0.5,
        metadata=flag(
            "a cut client waits a random delay up to this before resuming (default {default})",
            group="chaos clients",
            metavar="SECONDS",
            parse="non-negative",
        ),
    )
    input_rate_hz: float = field(
        default=1.0,
        metadata=flag(
            "inputs per second each client sends; each must be answered once (default {default})",
            group="chaos clients",
            metavar="HZ",
            parse="non-negative",
        ),
    )
    ack_every: int = field(
        default=10,
        metadata=flag(
            "clients acknowledge after every N events (default {default})",
            group="chaos clients",
            metavar="N",
        ),
    )
    #: Audio chunks a second per client (binary ``input_audio.append``), and their size.
    audio_rate_hz: float = field(
        default=10.0,
        metadata=flag(
            "binary audio chunks per second each client streams; each must be received "
            "once (default {default})",
            group="chaos clients",
            metavar="HZ",
            parse="non-negative",
        ),
    )
    audio_chunk_bytes: int = 640
    seed: int = field(
        default=0,
        metadata=flag(
            "seed of every random choice (default {default})",
            group="chaos clients",
            parse="integer",
        ),
    )
    secret: str | None = field(default=None, repr=False)
    #: PEM certificates to trust for ``wss://`` (``None``: the system's).
    ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.clients < 1:
            raise ValueError("clients must be >= 1")
        if not self.duration_s > 0:
            raise ValueError("duration_s must be positive")
        if min(self.drop_rate, self.input_rate_hz, self.audio_rate_hz) < 0 or (
            self.max_reconnect_delay_s < 0 or self.audio_chunk_bytes < 0
        ):
            raise ValueError("rates and delays must be >= 0")
        if self.ack_every < 1:
            raise ValueError("ack_every must be >= 1")


@dataclass(slots=True)
class ClientReport:
    sessions: int = 0
    events_delivered: int = 0
    disconnects: int = 0
    resumes: int = 0
    replayed: int = 0
    inputs: int = 0
    answered: int = 0
    lost: int = 0
    duplicated: int = 0
    errors: int = 0
    error_codes: dict[str, int] = field(default_factory=dict)
    #: Resumes answered by another process than the client's last connection's.
    resumes_across_processes: int = 0
    #: Sessions whose process was killed, resumed on another one.
    takeovers: int = 0
    #: Sessions whose process was killed and that never resumed anywhere.
    stranded: int = 0
    #: Client events (audio chunks) sent, each counted once however often resent.
    client_events_sent: int = 0
    #: Of those, received by the engine exactly once (one receipt each).
    client_events_received_once: int = 0
    #: Sent and never received; received more than once.
    lost_upstream: int = 0
    duplicated_upstream: int = 0
    #: Opens and resumes answered ``store_unavailable``, each tried again.
    store_retries: int = 0
    #: New events received after `Targets.store_fault_at`.
    events_after_fault: int = 0
    #: Per client, not added up: its session, and after `Targets.store_fault_at`
    #: each wait for a new event, ``(began, ended)`` in seconds after the fault.
    session_id: str = ""
    waits_after_fault: list[tuple[float, float]] = field(default_factory=list)


#: The `ClientReport` fields of one client that a total does not add up.
_PER_CLIENT = frozenset({"session_id", "waits_after_fault"})


@dataclass(slots=True)
class ChaosReport:
    totals: ClientReport
    clients: list[ClientReport]

    @property
    def ok(self) -> bool:
        t = self.totals
        return (
            t.lost == 0
            and t.duplicated == 0
            and t.errors == 0
            and t.stranded == 0
            and t.lost_upstream == 0
            and t.duplicated_upstream == 0
            and t.client_events_received_once == t.client_events_sent
        )


class Targets:
    """The gateway processes chaos clients connect to, and which of them are down."""

    def __init__(self, urls: Sequence[str], *, workers: bool = False) -> None:
        if not urls:
            raise ValueError("need at least one gateway URL")
        self.urls = tuple(urls)
        self.down: set[int] = set()
        #: Per process, how many clients' latest connections went to it.
        self.holding = [0] * len(self.urls)
        #: One URL served by worker processes (``serve --workers``): a client
        #: cannot tell which worker holds it, only that one was killed.
        self.workers = workers
        self.worker_killed = False
        #: When (``trio.current_time()``) the gateways' store suffered a fault:
        #: from then on each client measures its waits for new events.
        self.store_fault_at: float | None = None
        #: The sessions the clients opened so far.
        self.session_ids: list[str] = []

    @property
    def many(self) -> bool:
        return len(self.urls) > 1 or self.workers

    def mark_down(self, index: int) -> None:
        """The process at ``index`` was killed: no client picks it again."""
        self.down.add(index)

    def moved(self, before: int, after: int) -> None:
        if before >= 0:
            self.holding[before] -= 1
        self.holding[after] += 1

    def busiest(self) -> int:
        """The live process holding the most clients (the first, on a tie)."""
        live = [i for i in range(len(self.urls)) if i not in self.down]
        return max(live, key=self.holding.__getitem__)

    def pick(self, rng: random.Random) -> int:
        live = [i for i in range(len(self.urls)) if i not in self.down]
        return rng.choice(live) if live else 0


def total_of(reports: list[ClientReport]) -> ClientReport:
    """What ``reports`` add up to (not their per-client fields)."""
    total = ClientReport()
    for report in reports:
        for f in dataclasses.fields(ClientReport):
            if f.name in _PER_CLIENT:
                continue
            if f.name == "error_codes":
                for code, n in report.error_codes.items():
                    total.error_codes[code] = total.error_codes.get(code, 0) + n
            else:
                setattr(total, f.name, getattr(total, f.name) + getattr(report, f.name))
    return total
