"""The gateway's session registry: the door of the loop it runs on, with the gateway's options.

The gateway's settings that belong to the registry (``replay_ttl_s``,
``replay_max_bytes_per_session``, ``disconnect_grace_s``, ``send_timeout_s``)
come from its :class:`~supervisor.gateway.config.GatewayConfig`; any other
keyword option of ``open_session_registry`` (``restart_policy``,
``replay_max_events_per_session``, ``max_pending_per_session``,
``sweep_interval_s``, ``strict``...) passes through ``registry_options``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import sniffio

from actors.messages import LifecycleEvent
from supervisor.async_door import AsyncSessionRegistry
from supervisor.faults import FaultPlan
from supervisor.gateway.config import GatewayConfig

__all__ = ["open_registry"]

#: Set from GatewayConfig; ``registry_options`` may not set them again.
_FROM_CONFIG = frozenset(
    {
        "replay_ttl_s",
        "replay_max_bytes_per_session",
        "disconnect_grace_s",
        "send_timeout_s",
        "observer",
        "faults",
    }
)


@contextlib.asynccontextmanager
async def open_registry(
    config: GatewayConfig,
    *,
    observer: Callable[[LifecycleEvent], None],
    faults: FaultPlan | None = None,
    **registry_options: Any,
) -> AsyncIterator[AsyncSessionRegistry]:
    """The trio door under trio, the asyncio door under asyncio."""
    twice = _FROM_CONFIG & set(registry_options)
    if twice:
        raise ValueError(f"registry_options: set through GatewayConfig: {sorted(twice)}")
    options: dict[str, Any] = {
        "replay_ttl_s": config.replay_ttl_s,
        "replay_max_bytes_per_session": config.replay_max_bytes_per_session,
        "disconnect_grace_s": config.disconnect_grace_s,
        "send_timeout_s": config.send_timeout_s,
        "observer": observer,
        "faults": faults,
        **registry_options,
    }
    library = sniffio.current_async_library()
    if library == "trio":
        from supervisor.trio_registry import open_session_registry as open_trio  # noqa: PLC0415

        async with open_trio(**options) as registry:
            yield registry
    elif library == "asyncio":
        from supervisor.asyncio_registry import (  # noqa: PLC0415
            open_session_registry as open_asyncio,
        )

        async with open_asyncio(**options) as registry:
            yield registry
    else:
        raise RuntimeError(f"no session registry door for {library}")
