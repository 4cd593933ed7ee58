"""Chaos clients: connect, cut at random, resume, and check every event arrived once.

Each client opens a session, acknowledges as it goes, sends inputs and
streams audio chunks (binary client events, ``client_seq`` 1, 2, ...), cuts
its TCP connection at random (no close handshake), waits a short random
delay, resumes with the last sequence it received, resends inputs not yet
answered and the chunks after the server's ``last_client_seq``, and at the
end closes its session. It checks both directions: server events contiguous
from 1 with no duplicate and no gap, every input answered exactly once, every
chunk received exactly once (one ``input_audio.received`` each).
Randomness is seeded per client from one seed.

Against several gateway processes sharing one session store (`Targets`
with more than one URL) each connect and resume picks a live process at
random, so a resume often lands on another process and takes the session
over there; a connection broken because its process died is a cut like any
other, and the client resumes elsewhere. It counts the resumes that landed on
another process, and the takeovers of sessions whose process was killed.

An open or resume answered ``store_unavailable`` (the gateways' session store
is away; nothing changed) is tried again after a backoff (doubling from
`STORE_RETRY_S` to `STORE_RETRY_MAX_S`, jittered), and counted as a store
retry, not an error, until `STORE_GIVE_UP_S` past the run's end: then it is
an error (``store_unavailable``). What was lost or repeated is counted as
ever: a retry hides nothing.

When the caller marks a fault in the gateways' store (`Targets.store_fault_at`,
the cluster demo's SIGKILL of a primary), each client records from then on
each wait for its next new event, the run's end closing the last one
(`ClientReport.waits_after_fault`), so the caller can tell how long the
sessions the fault touched could not get through, and how long the others
waited meanwhile.

(One module over 400 lines: `_Client` is one client's whole run, its
connection, its cuts and both directions' books, over state every part
shares, so it stays one class; its config, targets and reports are in
``_chaos_terms``, its wire in ``_wire_client``.)
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable

import trio

from supervisor._client_policy import ACKED_WINDOW
from supervisor.cli._chaos_terms import (
    STORE_GIVE_UP_S,
    STORE_RETRY_MAX_S,
    STORE_RETRY_S,
    ChaosConfig,
    ChaosReport,
    ClientReport,
    Targets,
    total_of,
)
from supervisor.cli._wire_client import WireClient, WireClosedError, WireRejectedError
from supervisor.gateway._protocol import binary_event

__all__ = [
    "STORE_GIVE_UP_S",
    "STORE_RETRY_MAX_S",
    "STORE_RETRY_S",
    "ChaosConfig",
    "ChaosReport",
    "ClientReport",
    "Targets",
    "run_chaos",
]

#: A connection ended under the client: after its process died, a cut like any other.
_BROKEN = (WireClosedError, trio.BrokenResourceError, OSError)


class _RefusedError(Exception):
    """The gateway refused to open a session (its error frame was counted)."""


class _StoreAwayError(Exception):
    """The gateway answered ``store_unavailable``: try again later (counted)."""


class _Client:
    """One chaos client's state and checks."""

    def __init__(self, index: int, targets: Targets, config: ChaosConfig) -> None:
        self.targets = targets
        #: The process of the client's last connection, and of the resume in flight.
        self.process = -1
        self.resuming_from = -1
        self.config = config
        self.random = random.Random(config.seed * 1_000_003 + index)  # noqa: S311
        self.report = ClientReport()
        self.session_id = ""
        self.token = ""
        self.last_seq = 0
        self.unanswered: dict[str, str] = {}
        self.answered: set[str] = set()
        self.input_ids = itertools.count(1)
        self.prefix = f"c{index}"
        #: Chunks sent and not known handled (resent after a resume), by client_seq.
        self.pending: dict[int, bytes] = {}
        #: ``session.resumed``'s ``last_client_seq``: the chunks above it are resent.
        self.resumed_client_seq = 0
        self.received: set[int] = set()
        self.next_client_seq = 1
        #: The open connection, if any: closed whatever ends the run.
        self.ws: WireClient | None = None
        #: Its connection broke after a worker was killed, and it has not resumed since.
        self.orphaned = False
        #: The next wait after a ``store_unavailable`` answer (reset by a success).
        self.store_delay = STORE_RETRY_S
        #: When the last new event arrived.
        self.last_event_at = -math.inf

    def on_frame(self, frame: dict[str, object]) -> None:
        seq = frame.get("server_event_seq")
        kind = frame.get("type")
        if isinstance(seq, int):
            if seq > self.last_seq:
                self.waited_until(trio.current_time(), arrived=True)
            if seq == self.last_seq + 1:
                self.report.events_delivered += 1
                self.last_seq = seq
            elif seq <= self.last_seq:
                self.report.duplicated += 1
                return  # counted; what it says was taken in the first time
            else:
                self.report.lost += seq - self.last_seq - 1
                self.report.events_delivered += 1
                self.last_seq = seq
        if kind == "input_audio.received":
            self.on_receipt(frame.get("client_seq"))
        elif kind == "client_ack":
            self.acked(frame.get("client_seq"))
        elif kind == "session.created":
            self.acked(frame.get("last_client_seq"))
        if kind == "response.done":
            client_event_id = str(frame.get("client_event_id"))
            if client_event_id in self.answered:
                self.report.duplicated += 1
            else:
                self.answered.add(client_event_id)
                self.unanswered.pop(client_event_id, None)
                self.report.answered += 1
        elif kind == "session.resumed":
            self.token = str(frame["resume_token"])
            last_client_seq = frame.get("last_client_seq")
            self.acked(last_client_seq)
            self.resumed_client_seq = last_client_seq if isinstance(last_client_seq, int) else 0
            if self.resuming_from not in (-1, self.process):
                self.report.resumes_across_processes += 1
                if self.resuming_from in self.targets.down:
                    self.report.takeovers += 1
            elif self.orphaned:  # its worker died: taken over on whichever took it
                self.report.takeovers += 1
            self.orphaned = False
            self.resuming_from = -1
            replayed = frame.get("replayed")
            self.report.replayed += replayed if isinstance(replayed, int) else 0
        elif kind == "error":
            code = str(frame.get("code"))
            if code == "store_unavailable":
                self.report.store_retries += 1
                raise _StoreAwayError
            self.report.errors += 1
            self.report.error_codes[code] = self.report.error_codes.get(code, 0) + 1

    def waited_until(self, now: float, *, arrived: bool) -> None:
        """After a store fault: the wait since the fault or the last new event
        ends ``now`` (a new event ``arrived``, or the run ended)."""
        fault = self.targets.store_fault_at
        if fault is not None and now > fault:
            began = max(fault, self.last_event_at) - fault
            self.report.waits_after_fault.append((began, now - fault))
            self.report.events_after_fault += arrived
        if arrived:
            self.last_event_at = now

    def on_receipt(self, client_seq: object) -> None:
        if not isinstance(client_seq, int):
            return
        if client_seq in self.received:
            self.report.duplicated_upstream += 1
        else:
            self.received.add(client_seq)
            self.report.client_events_received_once += 1

    def acked(self, client_seq: object) -> None:
        """The process has every chunk through ``client_seq``. Accepted there,
        perhaps not yet handled in the store: the last `ACKED_WINDOW` of them
        are kept for a resume elsewhere (docs/protocol.md, *Ack rules*)."""
        if isinstance(client_seq, int):
            for seq in [s for s in self.pending if s <= client_seq - ACKED_WINDOW]:
                del self.pending[seq]

    async def send_audio(self, ws: WireClient) -> None:
        seq = self.next_client_seq
        self.next_client_seq += 1
        chunk = self.random.randbytes(self.config.audio_chunk_bytes)
        self.pending[seq] = chunk
        self.report.client_events_sent += 1
        await ws.send_bytes(_audio_chunk(seq, chunk))

    async def connect(self) -> WireClient:
        """A connection to a live process picked at random (another, if one refuses)."""
        attempts = len(self.targets.urls)
        for attempt in range(attempts):
            index = self.targets.pick(self.random)
            try:
                ws = await WireClient.connect(self.targets.urls[index], ca_file=self.config.ca_file)
            except WireRejectedError:
                raise  # an HTTP answer: the process lives and refused
            except (OSError, trio.BrokenResourceError, WireClosedError):
                # Refused, or cut mid-handshake (a reset, or the stream's end
                # before any answer) by a process killed meanwhile.
                if attempt + 1 == attempts or not self.targets.many:
                    raise
                continue
            self.targets.moved(self.process, index)
            self.process = index
            return ws
        raise AssertionError("unreachable")  # pragma: no cover

    async def open(self) -> WireClient:
        # Held before the first send: a send that breaks leaves it to run()'s cut.
        ws = self.ws = await self.connect()
        await ws.send_json({"type": "session.open", "secret": self.config.secret})
        created = await ws.receive_json()
        if created.get("type") != "session.created":
            self.on_frame(created)  # counts the error frame that refused it
            raise _RefusedError(str(created.get("code")))
        self.session_id = self.report.session_id = str(created["session_id"])
        self.targets.session_ids.append(self.session_id)
        self.token = str(created["resume_token"])
        self.report.sessions += 1
        return ws

    async def resume(self) -> WireClient:
        previous = self.process
        ws = self.ws = await self.connect()
        self.resuming_from = previous
        await ws.send_json(
            {
                "type": "session.resume",
                "session_id": self.session_id,
                "resume_token": self.token,
                "last_received_server_event_seq": self.last_seq,
            }
        )
        self.report.resumes += 1
        for client_event_id, text in list(self.unanswered.items()):
            await ws.send_json({"type": "input", "client_event_id": client_event_id, "text": text})
        return ws

    async def resend_chunks(self, ws: WireClient) -> None:
        """Chunks resume from what the server says it has: ``session.resumed`` first."""
        while True:
            frame = await ws.receive_json()
            self.on_frame(frame)
            if frame.get("type") == "session.resumed":
                break
        for seq, chunk in sorted(self.pending.items()):
            if seq > self.resumed_client_seq:
                await ws.send_bytes(_audio_chunk(seq, chunk))

    async def send_input(self, ws: WireClient) -> None:
        client_event_id = f"{self.prefix}-{next(self.input_ids)}"
        text = "say something " * self.random.randint(1, 4)
        self.unanswered[client_event_id] = text
        self.report.inputs += 1
        await ws.send_json({"type": "input", "client_event_id": client_event_id, "text": text})

    async def pump(self, ws: WireClient, until: float) -> bool:
        """Receive and act until ``until`` or a random cut; ``True`` if it cut."""
        tick = 0.05
        since_ack = 0
        while trio.current_time() < until:
            # Only receiving may be cut short: a send cancelled half-way would
            # leave half a frame on the wire.
            with trio.move_on_after(tick):
                while since_ack < self.config.ack_every:
                    self.on_frame(await ws.receive_json())
                    since_ack += 1
            if since_ack >= self.config.ack_every:
                since_ack = 0
                await ws.send_json({"type": "ack", "server_event_seq": self.last_seq})
            if self.random.random() < self.config.input_rate_hz * tick:
                await self.send_input(ws)
            if self.random.random() < self.config.audio_rate_hz * tick:
                await self.send_audio(ws)
            if self.random.random() < self.config.drop_rate * tick:
                return True
        return False

    async def run(self, deadline: float) -> None:
        """Play one client to ``deadline``; whatever goes wrong is counted, not raised."""
        try:
            await self._play(deadline)
        except OSError:
            if self.report.sessions == 0:
                raise  # no gateway there at all: the caller's error, not chaos
            self._count_failure("OSError")
        except WireRejectedError as exc:
            if self.report.sessions == 0:
                raise  # the gateway refused the upgrade itself: say its HTTP status
            self._count_failure(f"http_{exc.status}")
        except _StoreAwayError:
            self._count_failure("store_unavailable")
        except WireClosedError as exc:
            # Its close code and reason say whose failure it was (4000 replaced...).
            self._count_failure(f"closed {exc.code} {exc.reason or ''}".strip())
        except trio.BrokenResourceError as exc:
            self._count_failure(type(exc).__name__)
        except _RefusedError:
            pass  # a refusal's error frame was counted
        finally:
            if self.ws is not None:
                with trio.CancelScope(shield=True):
                    await self.ws.cut()

    async def _pump_or_broken(self, ws: WireClient, until: float) -> bool:
        """`pump`; with many processes, a connection its dead process broke is a
        cut; a ``store_unavailable`` answer is one too."""
        try:
            return await self.pump(ws, until)
        except _StoreAwayError:
            return True
        except _BROKEN:
            if not self._process_died():
                raise
            return True  # resume elsewhere, even past the deadline: answers are owed

    def _process_died(self) -> bool:
        """Whether a broken connection is its process's death (or, on one URL
        served by workers, came after a worker was killed)."""
        if self.targets.workers:
            self.orphaned = self.orphaned or self.targets.worker_killed
            return self.orphaned
        return self.process in self.targets.down

    async def _come_back(self, ws: WireClient, deadline: float) -> WireClient:
        """Cut, wait, resume; with many processes, a resume its process broke by
        dying is a cut too, and the client resumes again elsewhere; a resume
        answered ``store_unavailable`` is tried again after a backoff."""
        self.report.disconnects += 1
        delay = self.random.uniform(0, self.config.max_reconnect_delay_s)
        while True:
            await ws.cut()
            self.ws = None
            await trio.sleep(delay)
            try:
                # The resume's own sends break too if its process dies under them.
                ws = self.ws = await self.resume()
                await self.resend_chunks(ws)
            except _StoreAwayError:
                delay = self._store_backoff(deadline)
                continue
            except WireRejectedError:
                raise  # a live process answered: run() counts its status
            except _BROKEN:
                if self.ws is None:
                    raise  # connect tried every process and none took it: run() counts it
                ws = self.ws  # the connection the resume got, cut next
                if not self.targets.many or not self._process_died():
                    raise
                delay = self.random.uniform(0, self.config.max_reconnect_delay_s)
                continue
            self.store_delay = STORE_RETRY_S
            return ws

    async def _open_once_stored(self, deadline: float) -> WireClient:
        """`open`, tried again after a backoff while it is answered ``store_unavailable``."""
        while True:
            try:
                ws = await self.open()
            except _StoreAwayError:
                delay = self._store_backoff(deadline)
                if self.ws is not None:
                    await self.ws.cut()
                    self.ws = None
                await trio.sleep(delay)
                continue
            self.store_delay = STORE_RETRY_S
            return ws

    def _store_backoff(self, deadline: float) -> float:
        """How long to wait before trying the store again; past `STORE_GIVE_UP_S`
        after ``deadline``, the client gives up (an error ``store_unavailable``)."""
        if trio.current_time() > deadline + STORE_GIVE_UP_S:
            self._count_failure("store_unavailable")
            raise _RefusedError("store_unavailable")
        delay, self.store_delay = self.store_delay, min(self.store_delay * 2, STORE_RETRY_MAX_S)
        return self.random.uniform(delay / 2, delay)

    def _count_failure(self, name: str) -> None:
        self.report.errors += 1
        self.report.error_codes[name] = self.report.error_codes.get(name, 0) + 1

    async def _play(self, deadline: float) -> None:
        ws = self.ws = await self._open_once_stored(deadline)
        while await self._pump_or_broken(ws, deadline):
            ws = await self._come_back(ws, deadline)
        self.waited_until(deadline, arrived=False)
        if self.orphaned or (not self.targets.workers and self.process in self.targets.down):
            self.report.stranded += 1  # its process died and it never got back
        # Let the last answers arrive, then end the session politely.
        with trio.move_on_after(5):
            while self.unanswered or len(self.received) < self.report.client_events_sent:
                self.on_frame(await ws.receive_json())
        self.report.lost += len(self.unanswered)
        self.report.lost_upstream += self.report.client_events_sent - len(self.received)
        await ws.send_json({"type": "session.close"})
        with trio.move_on_after(2):
            try:
                while True:
                    self.on_frame(await ws.receive_json())
            except WireClosedError:
                pass
        await ws.close()
        self.ws = None


def _audio_chunk(client_seq: int, chunk: bytes) -> bytes:
    return binary_event({"type": "input_audio.append", "client_seq": client_seq}, chunk)


async def run_chaos(
    url: str | Targets,
    config: ChaosConfig,
    *,
    progress: Callable[[float, ClientReport], None] | None = None,
) -> ChaosReport:
    """Run ``config.clients`` chaos clients against ``url`` (or every process of
    ``url``, a `Targets`); report what they saw."""
    targets = url if isinstance(url, Targets) else Targets([url])
    clients = [_Client(i, targets, config) for i in range(config.clients)]
    start = trio.current_time()
    deadline = start + config.duration_s

    async def report_progress() -> None:
        while progress is not None:
            progress(trio.current_time() - start, total_of([c.report for c in clients]))
            await trio.sleep(0.2)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(report_progress)
        async with trio.open_nursery() as crowd:
            for client in clients:
                crowd.start_soon(client.run, deadline)
        nursery.cancel_scope.cancel()
    reports = [c.report for c in clients]
    return ChaosReport(totals=total_of(reports), clients=reports)
