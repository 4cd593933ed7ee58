"""Resume tokens and the digest-only credential that verifies them.

A token is 256 bits of ``secrets`` randomness, url-safe base64. The session
keeps only its SHA-256 digest; comparison is constant time. The plaintext
lives in a `ResumeToken` whose repr and str never show it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

__all__ = ["ResumeCredential", "ResumeToken", "token_digest"]

_TOKEN_BYTES = 32  # 256 bits


def token_digest(plaintext: str) -> bytes:
    """SHA-256 of the token's UTF-8 bytes: the only form a session stores.

    A lone surrogate (no real token has one) is hashed as is, so it fails to
    verify like any wrong token instead of raising in the session.
    """
    return hashlib.sha256(plaintext.encode("utf-8", "surrogatepass")).digest()


@dataclass(frozen=True, slots=True)
class ResumeToken:
    """A resume token's plaintext, for handing to the client once.

    ``str()`` and ``repr()`` are redacted; read ``plaintext`` on purpose.
    """

    plaintext: str = field(repr=False)

    @classmethod
    def generate(cls) -> ResumeToken:
        """A new random token: 256 bits, URL-safe base64."""
        return cls(secrets.token_urlsafe(_TOKEN_BYTES))

    def __str__(self) -> str:
        return "ResumeToken(<redacted>)"


@dataclass(slots=True)
class ResumeCredential:
    """The digest of the session's current token. Mutable: ``rotate`` replaces it."""

    token_digest: bytes = field(repr=False)

    @classmethod
    def from_token(cls, token: ResumeToken) -> ResumeCredential:
        """The credential that verifies ``token``: its SHA-256 digest only."""
        return cls(token_digest=token_digest(token.plaintext))

    @staticmethod
    def _digest(plaintext: str) -> bytes:
        # The seed's spelling; kept for code that called it.
        return token_digest(plaintext)

    def verify(self, plaintext: str) -> bool:
        """Whether ``plaintext`` is the current token (constant-time comparison)."""
        return hmac.compare_digest(self.token_digest, token_digest(plaintext))

    def rotate(self) -> ResumeToken:
        """Issue a new token; the old one stops verifying at once."""
        token = ResumeToken.generate()
        self.token_digest = token_digest(token.plaintext)
        return token
