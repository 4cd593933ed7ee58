"""Optional dependencies: which extra brings each, and one line when one is missing.

A command or import that needs a package of an extra (``redis``, ``asgi``,
``fastapi``, ``bench``) checks for it first, so a user who installed less
gets one line naming what to install, never a traceback.
"""

from __future__ import annotations

import importlib.util

from actors._errors import SessionError

__all__ = ["EXTRA_OF", "MissingExtraError", "require"]

#: The extra of ``duplex-supervisor`` that installs each optional package.
EXTRA_OF = {
    "redis": "redis",
    "uvicorn": "asgi",
    "hypercorn": "asgi",
    "fastapi": "fastapi",
    "matplotlib": "bench",
}


class MissingExtraError(SessionError, ModuleNotFoundError):
    """An optional package is not installed; the message names the extra that brings it."""

    def __init__(self, module: str, purpose: str) -> None:
        extra = EXTRA_OF[module]
        super().__init__(
            f"{purpose} needs {module}: pip install 'duplex-supervisor[{extra}]'", name=module
        )


def require(module: str, purpose: str) -> None:
    """Raise `MissingExtraError` unless ``module`` (a key of `EXTRA_OF`) can be imported."""
    if importlib.util.find_spec(module) is None:
        raise MissingExtraError(module, purpose)
