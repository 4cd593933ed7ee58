"""The gateway's session registry: the door of the loop it runs on, with its options.

``registry_options`` (a `RegistryOptions`) is the
registry's options when given: then `GatewayConfig`'s
``replay_ttl_s``, ``replay_max_bytes_per_session``, ``disconnect_grace_s``,
``passivate_after_s`` and ``send_timeout_s`` (what ``serve``'s flags set)
are not used. The
gateway observes the registry itself: an ``observer`` in the options is
called after the gateway's own, and ``faults`` given to the gateway take
the place of the options' faults.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import sniffio

from actors._commands import LifecycleEvent
from supervisor._faults import FaultPlan
from supervisor._options import RegistryOptions
from supervisor.doors._door import AsyncSessionRegistry
from supervisor.gateway._config import GatewayConfig

__all__ = ["open_registry", "registry_options_for"]


def registry_options_for(
    config: GatewayConfig,
    options: RegistryOptions | None,
    *,
    observer: Callable[[LifecycleEvent], None],
    faults: FaultPlan | None,
) -> RegistryOptions:
    """The options the gateway's registry opens with; see the module docstring."""
    if options is None:
        options = RegistryOptions(
            replay_ttl_s=config.replay_ttl_s,
            replay_max_bytes_per_session=config.replay_max_bytes_per_session,
            disconnect_grace_s=config.disconnect_grace_s,
            passivate_after_s=config.passivate_after_s,
            send_timeout_s=config.send_timeout_s,
        )
    theirs = options.observer

    def observe(event: LifecycleEvent) -> None:
        observer(event)
        if theirs is not None:
            theirs(event)

    return dataclasses.replace(
        options, observer=observe, faults=faults if faults is not None else options.faults
    )


@contextlib.asynccontextmanager
async def open_registry(
    config: GatewayConfig,
    options: RegistryOptions | None = None,
    *,
    observer: Callable[[LifecycleEvent], None],
    faults: FaultPlan | None = None,
) -> AsyncIterator[AsyncSessionRegistry]:
    """The trio door under trio, the asyncio door under asyncio."""
    chosen = registry_options_for(config, options, observer=observer, faults=faults)
    fields: dict[str, Any] = {f.name: getattr(chosen, f.name) for f in dataclasses.fields(chosen)}
    library = sniffio.current_async_library()
    if library == "trio":
        from supervisor.doors._trio import open_session_registry as open_trio  # noqa: PLC0415

        async with open_trio(**fields) as registry:
            yield registry
    elif library == "asyncio":
        from supervisor.doors._asyncio import (  # noqa: PLC0415
            open_session_registry as open_asyncio,
        )

        async with open_asyncio(**fields) as registry:
            yield registry
    else:
        raise RuntimeError(f"no session registry door for {library}")
