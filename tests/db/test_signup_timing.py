"""Issue 22, L6: sign-up must not tell an address that has an account from one that has
none. allauth answers both alike (enumeration prevention), but only a new account's
password was hashed: the attack times the two answers, and here they cost the same. The
cost is counted in hashings, never timed (timings on a shared machine prove nothing)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.contrib.auth import hashers
from django.contrib.auth.models import User
from django.test import Client

from tests.factories import user_make

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery staple 42"
PBKDF2 = "django.contrib.auth.hashers.PBKDF2PasswordHasher"


def sign_up(email: str) -> int:
    """One sign-up from a fresh client: its status."""
    response = Client().post("/accounts/signup/", {
        "email": email, "password1": PASSWORD, "password2": PASSWORD})
    return response.status_code


def test_a_taken_address_costs_a_sign_up_the_same_password_hashing(
        settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    # given the production hasher (the tests' default is MD5, which costs nothing) and an
    # address that has an account
    settings.PASSWORD_HASHERS = [PBKDF2]
    hashed: list[str] = []
    encode = hashers.PBKDF2PasswordHasher.encode

    def counted(self: Any, password: str, salt: str, iterations: int | None = None) -> str:
        hashed.append(password)
        return encode(self, password, salt, iterations)

    monkeypatch.setattr(hashers.PBKDF2PasswordHasher, "encode", counted)
    taken = user_make(email=f"taken-{uuid.uuid4().hex[:8]}@example.com")
    hashed.clear()
    # when both a new and a taken address sign up
    new_status = sign_up(f"new-{uuid.uuid4().hex[:8]}@example.com")
    new_hashes = len(hashed)
    taken_status = sign_up(taken.email)
    # then both are answered alike, each after one hashing of the password
    assert new_status == taken_status == 302
    assert new_hashes == 1 and len(hashed) == 2
    # and no account was made for the taken address
    assert User.objects.filter(email=taken.email).count() == 1

