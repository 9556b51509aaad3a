"""API key format: `sk-` + a 12-character id prefix + `_` + a 40-character secret.

The prefix is stored in clear (unique, indexed) to find the key; of the secret only a
SHA-256 digest is stored. The secret carries ~238 bits of randomness, so a fast digest is
enough: there is nothing to brute-force, and a slow KDF would only tax every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import string
from dataclasses import dataclass

KEY_SCHEME = "sk-"
PREFIX_LENGTH = 12
SECRET_LENGTH = 40
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits


@dataclass(frozen=True)
class KeyParts:
    prefix: str
    secret: str

    @property
    def plaintext(self) -> str:
        return f"{KEY_SCHEME}{self.prefix}_{self.secret}"


def key_generate() -> KeyParts:
    prefix = "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(PREFIX_LENGTH))
    secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(SECRET_LENGTH))
    return KeyParts(prefix=prefix, secret=secret)


def key_parse(raw: str) -> KeyParts | None:
    """The parts of a presented key, or None when it cannot be one of ours."""
    if len(raw) != len(KEY_SCHEME) + PREFIX_LENGTH + 1 + SECRET_LENGTH:
        return None
    if not raw.startswith(KEY_SCHEME):
        return None
    prefix, sep, secret = raw[len(KEY_SCHEME):].partition("_")
    if sep != "_" or len(prefix) != PREFIX_LENGTH or len(secret) != SECRET_LENGTH:
        return None
    if not (set(prefix) <= set(_PREFIX_ALPHABET) and set(secret) <= set(_SECRET_ALPHABET)):
        return None
    return KeyParts(prefix=prefix, secret=secret)


def secret_hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def secret_matches(secret: str, stored_hash: str) -> bool:
    return hmac.compare_digest(secret_hash(secret), stored_hash)


def key_display(prefix: str) -> str:
    """How a key is shown after creation: its prefix only."""
    return f"{KEY_SCHEME}{prefix}_…"
