"""A running gateway raises the collector's young threshold and puts it back."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest
import trio

from supervisor.gateway import GatewayConfig
from supervisor.gateway._collector import young_collections
from supervisor.gateway.asgi import GatewayApp
from tests.gateway_support import running_gateway

LIMIT = 20


@pytest.fixture
def interpreter_thresholds() -> Iterator[tuple[int, ...]]:
    found = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    try:
        yield gc.get_threshold()
    finally:
        gc.set_threshold(*found)


async def test_a_served_gateway_sets_its_young_threshold_while_it_runs(
    interpreter_thresholds: tuple[int, ...],
) -> None:
    with trio.fail_after(LIMIT):
        async with running_gateway(GatewayConfig(port=0, gc_young_threshold=40_000)):
            assert gc.get_threshold() == (40_000, 10, 10)
    assert gc.get_threshold() == interpreter_thresholds


async def test_a_gateway_apps_lifespan_sets_its_young_threshold_while_it_runs(
    interpreter_thresholds: tuple[int, ...],
) -> None:
    app = GatewayApp(GatewayConfig(gc_young_threshold=30_000))
    with trio.fail_after(LIMIT):
        async with app.lifespan():
            assert gc.get_threshold() == (30_000, 10, 10)
    assert gc.get_threshold() == interpreter_thresholds


def test_overlapping_gateways_put_the_interpreters_threshold_back_after_the_last(
    interpreter_thresholds: tuple[int, ...],
) -> None:
    first = young_collections(50_000)
    second = young_collections(20_000)
    first.__enter__()
    second.__enter__()
    assert gc.get_threshold() == (50_000, 10, 10)  # never lowered by a later one
    first.__exit__(None, None, None)
    assert gc.get_threshold() == (50_000, 10, 10)  # the second still runs
    second.__exit__(None, None, None)
    assert gc.get_threshold() == interpreter_thresholds


def test_a_threshold_below_the_interpreters_leaves_it(
    interpreter_thresholds: tuple[int, ...],
) -> None:
    with young_collections(100):
        assert gc.get_threshold() == interpreter_thresholds
    assert gc.get_threshold() == interpreter_thresholds


@pytest.mark.parametrize("threshold", [0, -5])
def test_a_threshold_that_is_not_positive_is_refused(threshold: int) -> None:
    # 0 would read as "disable the collector" (gc.set_threshold(0)); refused with its name.
    with pytest.raises(ValueError, match="gc_young_threshold must be positive"):
        GatewayConfig(gc_young_threshold=threshold)
