"""Who is connecting: the handshake, the client's address, the ``authenticate`` hook.

`Handshake` is what every shell knows of a WebSocket upgrade (path,
query, headers, peer). `client_address` says which address a
connection's limits and throttles count against: the TCP peer, unless the
peer is one of the configured trusted proxies, in which case the right-most
``X-Forwarded-For`` entry that is not itself a trusted proxy (a client can
write anything left of what its own proxy appended, so only entries added
by trusted hops are believed).

An ``authenticate`` hook is given the handshake and returns an identity
(any value but ``None``) or refuses (``None``, or raises
`Unauthorized`): the client gets ``error unauthorized`` and close
4401. The identity is bound to the session it opens: a resume must come
from an equal identity as well as carry the token.
"""

from __future__ import annotations

import hmac
import ipaddress
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "Authenticate",
    "Handshake",
    "TrustedProxies",
    "Unauthorized",
    "bearer_secret",
    "client_address",
]


class Unauthorized(Exception):  # noqa: N818 - the hook's answer, named as the protocol's error
    """Raised by an ``authenticate`` hook to refuse a connection (close 4401)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Handshake:
    """A WebSocket upgrade request as every shell sees it. Header names are lower case."""

    path: str
    query: str
    headers: Mapping[str, str] = field(repr=False)
    #: The TCP peer's address (a proxy's, behind one).
    peer: str
    #: The client's address, through trusted proxies (see `client_address`).
    client: str
    #: The opening frame's ``secret`` (``session.open`` or ``session.resume``),
    #: when the hook runs on the first frame (`GatewayConfig.authenticate_on_first_frame`):
    #: a browser cannot set ``Authorization`` on a WebSocket, and a URL is logged.
    credential: str | None = field(default=None, repr=False)

    def query_params(self) -> dict[str, list[str]]:
        return urllib.parse.parse_qs(self.query)


#: ``authenticate(handshake) -> identity | None`` (a coroutine function may be given too).
Authenticate = Callable[[Handshake], "object | Awaitable[object]"]


class TrustedProxies:
    """A list of addresses and networks (``10.0.0.0/8``, ``127.0.0.1``)."""

    def __init__(self, entries: Sequence[str] = ()) -> None:
        self._networks = [ipaddress.ip_network(entry, strict=False) for entry in entries]

    def __bool__(self) -> bool:
        return bool(self._networks)

    def __contains__(self, address: str) -> bool:
        try:
            ip = ipaddress.ip_address(address.strip())
        except ValueError:
            return False
        return any(ip in network for network in self._networks)


def client_address(peer: str, forwarded_for: Sequence[str], trusted: TrustedProxies) -> str:
    """The client's address: ``peer``, or (from a trusted proxy) the right-most
    ``X-Forwarded-For`` hop that is not trusted. ``forwarded_for``: every
    ``X-Forwarded-For`` header value, in order."""
    if not trusted or peer not in trusted:
        return peer
    hops = [hop.strip() for value in forwarded_for for hop in value.split(",") if hop.strip()]
    for hop in reversed(hops):
        if hop not in trusted:
            return hop
    return hops[0] if hops else peer


def bearer_secret(secret: str) -> Callable[[Handshake], object | None]:
    """An ``authenticate`` hook: ``Authorization: Bearer <secret>``, or the opening
    frame's ``secret`` (with ``authenticate_on_first_frame``), or ``?token=``.

    The identity is the constant ``"bearer"``: everyone holding the secret is
    one identity. Compared in constant time.
    """
    expected = secret.encode()

    def authenticate(handshake: Handshake) -> object | None:
        presented = ""
        header = handshake.headers.get("authorization", "")
        if header[:7].lower() == "bearer ":
            presented = header[7:].strip()
        elif handshake.credential is not None:
            presented = handshake.credential
        else:
            presented = (handshake.query_params().get("token") or [""])[0]
        if presented and hmac.compare_digest(presented.encode(), expected):
            return "bearer"
        return None

    return authenticate
