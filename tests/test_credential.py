"""ResumeToken and ResumeCredential: 256-bit url-safe tokens, digest-only storage."""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import re

import pytest

from actors._credential import ResumeCredential, ResumeToken, token_digest

URL_SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def test_generated_token_is_43_url_safe_chars() -> None:
    token = ResumeToken.generate()
    assert len(token.plaintext) == 43
    assert URL_SAFE.match(token.plaintext)


def test_generated_token_decodes_to_256_bits() -> None:
    token = ResumeToken.generate()
    raw = base64.urlsafe_b64decode(token.plaintext + "=")
    assert len(raw) == 32


def test_generated_tokens_are_distinct() -> None:
    assert len({ResumeToken.generate().plaintext for _ in range(200)}) == 200


def test_token_repr_and_str_never_show_the_plaintext() -> None:
    token = ResumeToken.generate()
    for text in (repr(token), str(token), f"{token}", f"{token!r}", repr([token])):
        assert token.plaintext not in text


def test_token_is_immutable() -> None:
    token = ResumeToken.generate()
    with pytest.raises(dataclasses.FrozenInstanceError):
        token.plaintext = "x"  # type: ignore[misc]


def test_credential_stores_only_the_sha256_digest() -> None:
    token = ResumeToken.generate()
    credential = ResumeCredential.from_token(token)
    assert credential.token_digest == hashlib.sha256(token.plaintext.encode()).digest()
    assert [f.name for f in dataclasses.fields(credential)] == ["token_digest"]
    assert not hasattr(credential, "__dict__")


def test_token_digest_matches_the_seeds_spelling() -> None:
    assert ResumeCredential._digest("abc") == token_digest("abc")
    assert token_digest("abc") == hashlib.sha256(b"abc").digest()


def test_credential_repr_shows_neither_token_nor_digest() -> None:
    token = ResumeToken.generate()
    credential = ResumeCredential.from_token(token)
    text = repr(credential) + str(credential)
    assert token.plaintext not in text
    assert credential.token_digest.hex() not in text
    assert repr(credential.token_digest) not in text


def test_verify_accepts_the_token_and_rejects_others() -> None:
    token = ResumeToken.generate()
    credential = ResumeCredential.from_token(token)
    assert credential.verify(token.plaintext)
    assert not credential.verify(ResumeToken.generate().plaintext)
    assert not credential.verify("")
    assert not credential.verify(token.plaintext[:-1])
    assert not credential.verify(token.plaintext + "x")


def test_verify_handles_non_ascii_input() -> None:
    credential = ResumeCredential.from_token(ResumeToken("jéton-ß"))
    assert credential.verify("jéton-ß")
    assert not credential.verify("jeton-ss")


def test_verify_compares_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return bool(real(a, b))

    monkeypatch.setattr(hmac, "compare_digest", spy)
    token = ResumeToken.generate()
    assert ResumeCredential.from_token(token).verify(token.plaintext)
    assert calls == [(token_digest(token.plaintext), token_digest(token.plaintext))]


def test_rotate_issues_a_new_token_and_kills_the_old_one() -> None:
    old = ResumeToken.generate()
    credential = ResumeCredential.from_token(old)
    new = credential.rotate()
    assert new.plaintext != old.plaintext
    assert len(new.plaintext) == 43
    assert credential.verify(new.plaintext)
    assert not credential.verify(old.plaintext)
    assert credential.token_digest == token_digest(new.plaintext)


def test_rotate_twice_leaves_only_the_newest_token_alive() -> None:
    credential = ResumeCredential.from_token(ResumeToken.generate())
    first = credential.rotate()
    second = credential.rotate()
    assert not credential.verify(first.plaintext)
    assert credential.verify(second.plaintext)
