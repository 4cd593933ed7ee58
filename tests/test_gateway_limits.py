"""The limits' bookkeeping with plain calls and made-up times, and the throttle
tables of a running gateway staying bounded."""

from __future__ import annotations

import logging

import pytest
import trio

from supervisor._log_limit import LogLimiter, ThirdPartyLogLimit
from supervisor.gateway._limits import AddressCounter, FailureThrottle, InputRate
from supervisor.gateway._server import GatewayConfig
from tests.gateway_support import LIMIT, read_until_closed, running_gateway


def test_the_throttle_blocks_after_allowed_failures_within_the_window() -> None:
    throttle = FailureThrottle(allowed=3, window_s=60, max_addresses=100)
    assert not throttle.blocked("a", 0)
    assert len(throttle) == 0  # asking stores nothing
    for t in (1, 2, 3):
        throttle.failed("a", t)
    assert throttle.blocked("a", 3)
    assert not throttle.blocked("b", 3)
    assert throttle.blocked("a", 60.9)  # the first failure is 59.9 s old
    assert not throttle.blocked("a", 61.5)  # it is past the window now


def test_the_throttle_forgets_addresses_past_their_window() -> None:
    throttle = FailureThrottle(allowed=2, window_s=10, max_addresses=1000)
    for n in range(500):
        throttle.failed(f"10.0.{n // 256}.{n % 256}", n / 100)
    assert len(throttle) == 500
    throttle.failed("late", 20)  # every earlier failure is older than 10 s
    assert len(throttle) == 1


def test_the_throttle_table_is_bounded() -> None:
    throttle = FailureThrottle(allowed=2, window_s=3600, max_addresses=100)
    for n in range(10_000):
        throttle.failed(f"addr{n}", n)
        throttle.failed(f"addr{n}", n)
    assert len(throttle) == 100
    # The newest are kept, each still blocked; the oldest went first.
    assert throttle.blocked("addr9999", 10_000)
    assert not throttle.blocked("addr0", 10_000)


def test_the_address_counter_caps_per_address_and_in_total() -> None:
    counter = AddressCounter(total=3, per_address=2)
    assert counter.refusal("a") is None
    counter.take("a")
    counter.take("a")
    assert counter.refusal("a") == "address"
    assert counter.refusal("b") is None
    counter.take("b")
    assert counter.refusal("c") == "total"
    counter.release("a")
    assert counter.refusal("c") is None
    counter.release("zzz")  # never taken: no effect
    assert (counter.total, counter.held_by("a"), len(counter)) == (2, 1, 2)


@pytest.mark.parametrize(("rate", "burst"), [(5.0, 5), (0.01, 1)])
def test_the_input_rate_allows_a_burst_then_refills(rate: float, burst: int) -> None:
    bucket = InputRate(rate)
    assert [bucket.allow(100.0) for _ in range(burst + 3)] == [True] * burst + [False] * 3
    assert bucket.allow(100.0 + 1 / rate)  # one more after one period
    assert not bucket.allow(100.0 + 1 / rate)


def test_the_log_limiter_writes_one_line_per_interval_and_a_summary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("duplex_supervisor.test_limits")
    limiter = LogLimiter(logger, interval_s=10)
    with caplog.at_level(logging.INFO, logger=logger.name):
        logged = [
            limiter.log(logging.WARNING, "k", "refused %s", n, now=n / 1000) for n in range(5000)
        ]
        assert logged.count(True) == 1
        assert limiter.log(logging.WARNING, "other", "another kind", now=1)
        limiter.log(logging.WARNING, "k", "refused %s", "late", now=11)
        limiter.log(logging.WARNING, "k", "refused %s", "later", now=12)
        limiter.flush(now=30)
        limiter.flush(now=60)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refused 0",
        "another kind",
        "refused late (and 4999 more like it in the last 10 s, not logged)",
        "k: 1 more lines like the last one, not logged",
    ], lines


def test_a_summary_goes_out_at_the_level_of_the_lines_it_stands_for(
    caplog: pytest.LogCaptureFixture,
) -> None:
    logger = logging.getLogger("duplex_supervisor.test_limits")
    limiter = LogLimiter(logger, interval_s=10)
    with caplog.at_level(logging.INFO, logger=logger.name):
        for n in range(3):
            limiter.log(logging.INFO, "probe", "refused a resume %s", n, now=n)
        limiter.flush(now=20)
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.INFO, "refused a resume 0"),
        (logging.INFO, "probe: 2 more lines like the last one, not logged"),
    ]


def test_a_servers_own_log_lines_go_out_once_per_interval_ours_untouched() -> None:
    """uvicorn's "Invalid HTTP request received.", asyncio's accept error: a client
    repeats them at will, so the handler lets one a message through per interval."""
    limit = ThirdPartyLogLimit(interval_s=600)

    def record(name: str, message: str, *args: object) -> logging.LogRecord:
        return logging.LogRecord(name, logging.WARNING, __file__, 1, message, args, None)

    passed = [
        limit.filter(record("uvicorn.error", "Invalid HTTP request received.")) for _ in range(50)
    ]
    assert passed == [True] + [False] * 49
    assert limit.filter(record("uvicorn.error", "Exceeded concurrency limit."))
    ours = record("duplex_supervisor.supervisor", "gateway listening on %s", "x")
    assert all(limit.filter(ours) for _ in range(3))


async def test_a_gateways_throttle_tables_stay_bounded() -> None:
    config = GatewayConfig(
        port=0,
        resume_failures_allowed=1,
        throttle_max_addresses=5,
        session_resume_failures_allowed=1_000,
    )
    with trio.fail_after(LIMIT):
        async with running_gateway(config) as harness:
            sid = (await harness.open()).session_id
            for n in range(12):
                client = await harness.resume(sid, "t", 0, local_address=f"127.0.0.{n + 2}")
                frames, closed = await read_until_closed(client)
                assert closed.code == 4403, (frames, closed)
            # Per address: 5 kept; per session: one (this session's).
            assert harness.gateway.throttled_addresses() == 5 + 1
            # The newest addresses are still throttled; the oldest were forgotten.
            client = await harness.resume(sid, "t", 0, local_address="127.0.0.13")
            assert (await read_until_closed(client))[1].code == 4429
            client = await harness.resume(sid, "t", 0, local_address="127.0.0.2")
            assert (await read_until_closed(client))[1].code == 4403
