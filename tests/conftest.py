"""What every test module shares: one FakeClock and one Wire (from the plugin).

The package's pytest plugin, :mod:`supervisor.testing`, is loaded from its
entry point; its ``duplex_*`` fixtures are there too. The helpers for each
door (``trio_support``, ``asyncio_support``, ``actor_support``, ``helpers``)
build on these two classes.
"""

from __future__ import annotations

import pytest

from supervisor.testing import FakeClock, Wire


@pytest.fixture
def clock() -> FakeClock:
    """A fake clock, at 1000.0."""
    return FakeClock()


@pytest.fixture
def wire() -> Wire:
    """A recording transport for any door."""
    return Wire()
