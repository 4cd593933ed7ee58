"""The demo page (``serve --demo-page``): ``/`` and the browser client it loads.

The page (``static/demo.html``) runs `clients/js/duplex-client.js` against its
own origin and the gateway's path, so it works through any proxy in front.
The client module has one source, ``clients/js/duplex-client.js``: a wheel
carries it as ``supervisor/gateway/static/duplex-client.js`` (pyproject's
``force-include``), a checkout reads it where it is.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path

__all__ = ["CLIENT_MODULE", "client_module_source", "demo_page_routes"]

_STATIC = Path(__file__).resolve().parent / "static"

#: Where the page loads the client module from (a path on the gateway).
CLIENT_MODULE = "/duplex-client.js"


def client_module_source() -> bytes:
    """The browser client's ES module: packaged with a wheel, or the checkout's."""
    packaged = _STATIC / "duplex-client.js"
    if packaged.is_file():
        return packaged.read_bytes()
    return (_STATIC.parents[2] / "clients" / "js" / "duplex-client.js").read_bytes()


def demo_page_routes(path: str) -> Callable[[str], tuple[int, str, bytes] | None]:
    """The page's GETs, for a gateway whose WebSocket endpoint is ``path``."""
    page = (
        (_STATIC / "demo.html")
        .read_text(encoding="utf-8")
        .replace("{{ws_path}}", html.escape(path, quote=True))
        .encode("utf-8")
    )
    module = client_module_source()

    def route(target: str) -> tuple[int, str, bytes] | None:
        if target in ("/", "/index.html"):
            return 200, "text/html; charset=utf-8", page
        if target == CLIENT_MODULE:
            return 200, "text/javascript; charset=utf-8", module
        return None

    return route
