"""Issue 40, found from outside: a person who had just signed up, confirmed the address and
signed in was asked for the password again on creating their first API key. A sign-in
that just completed is a recent authentication (console.accounts); one older than
ACCOUNT_REAUTHENTICATION_TIMEOUT is not, and is still asked."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from allauth.account import app_settings as allauth_settings
from django.core import mail
from django.test import Client
from pytest_django import Settings

from console.models import ApiKey, Membership
from tests.db.test_console import PASSWORD, form
from tests.db.test_console_hardening import age_reauthentication

pytestmark = pytest.mark.django_db
KEYS = "/console/keys"


def signed_up(capture: Callable[..., Any]) -> tuple[Client, str]:
    """Sign up with a fresh address (allauth rate-limits mails per address in Redis, which
    outlives a test) and confirm it through the mailed link, as a person does."""
    client = Client()
    email = f"new-{uuid.uuid4().hex[:10]}@example.com"
    with capture(execute=True):
        response = client.post("/accounts/signup/", {
            "email": email, "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 302
    link = re.search(r"https?://\S+/accounts/confirm-email/\S+/", str(mail.outbox[-1].body))
    assert link is not None
    assert client.post(link.group(0).split("testserver")[-1]).status_code == 302
    return client, email


def first_key(client: Client, email: str, name: str) -> Any:
    organization = Membership.objects.get(user__email=email).organization
    return client.post(KEYS, form(organization, {"name": name}))


def test_signing_in_after_the_confirmation_creates_the_first_key_without_asking_again(
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    client, email = signed_up(django_capture_on_commit_callbacks)
    signed = client.post("/accounts/login/", {"login": email, "password": PASSWORD})
    assert signed.status_code == 302 and "_auth_user_id" in client.session
    # the sign-in a moment ago is recent: the key is created, not sent to re-authenticate
    response = first_key(client, email, "first")
    assert response.status_code == 200, response.get("Location")
    assert ApiKey.objects.filter(name="first", created_by__email=email).exists()


def test_the_confirmation_that_signs_in_counts_as_recent(
        settings: Settings, django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    # allauth signs in the session that signed up when its link is confirmed, with this on
    settings.ACCOUNT_LOGIN_ON_EMAIL_CONFIRMATION = True
    client, email = signed_up(django_capture_on_commit_callbacks)
    assert "_auth_user_id" in client.session
    response = first_key(client, email, "first")
    assert response.status_code == 200, response.get("Location")
    assert ApiKey.objects.filter(name="first", created_by__email=email).exists()


def test_a_sign_in_no_longer_recent_is_asked_again(
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    client, email = signed_up(django_capture_on_commit_callbacks)
    client.post("/accounts/login/", {"login": email, "password": PASSWORD})
    # the sign-in was just past the re-authentication timeout ago
    age_reauthentication(client, allauth_settings.REAUTHENTICATION_TIMEOUT + 1)
    response = first_key(client, email, "late")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/reauthenticate/?next=")
    assert not ApiKey.objects.filter(name="late").exists()
    # allauth's own sensitive pages read the same record: two-factor set-up asks too
    activate = client.get("/accounts/2fa/totp/activate/")
    assert activate.status_code == 302 and "/accounts/reauthenticate/" in activate["Location"]
