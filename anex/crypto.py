"""Secrets we must read back (webhook signing secrets) are stored encrypted.

Fernet (AES-128-CBC + HMAC-SHA256) with a key from ANEX_ENCRYPTION_KEY, or derived from
SECRET_KEY with HKDF when that is unset. Rotating the key source makes stored secrets
unreadable, so a deployment sets ANEX_ENCRYPTION_KEY explicitly and keeps it.
"""

from __future__ import annotations

import base64
from functools import cache

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings


class DecryptionFailed(Exception):
    pass


@cache
def _fernet(key_material: str) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None,
                   info=b"anex field encryption v1").derive(key_material.encode())
    return Fernet(base64.urlsafe_b64encode(derived))


def _current() -> Fernet:
    return _fernet(settings.ANEX_ENCRYPTION_KEY or settings.SECRET_KEY)


def secret_encrypt(plaintext: str) -> str:
    return _current().encrypt(plaintext.encode()).decode()


def secret_decrypt(token: str) -> str:
    try:
        return _current().decrypt(token.encode()).decode()
    except InvalidToken:
        raise DecryptionFailed("stored secret cannot be decrypted with the current key") \
            from None
