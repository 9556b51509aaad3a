"""Issue 22, L8: free-grant farming. The grant came with every sign-up, verified or not, and
every +tag or Gmail dot of one mailbox was a new sign-up. It now waits for the address to
be verified, and each normalized mailbox is granted once."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.core import mail
from django.test import Client
from pytest_django import Settings

from billing.services import credits_summary
from console.models import Membership, Organization
from console.services import mailbox_normalize

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery"


def test_a_mailbox_is_its_address_lowercased_without_tags_or_gmail_dots() -> None:
    assert mailbox_normalize("Ada.Lovelace+farm7@GMail.com") == "adalovelace@gmail.com"
    assert mailbox_normalize("ada.lovelace@googlemail.com") == "adalovelace@gmail.com"
    assert mailbox_normalize("ada.lovelace+x@example.com") == "ada.lovelace@example.com"


def sign_up(email: str, capture: Callable[..., Any], *, verify: bool) -> Organization:
    """Sign up through allauth's pages; with verify, open the link the mail carries."""
    client = Client()
    mail.outbox.clear()
    with capture(execute=True):
        assert client.post("/accounts/signup/", {"email": email, "password1": PASSWORD,
                                                 "password2": PASSWORD}).status_code == 302
    user = get_user_model().objects.get(email__iexact=email)
    if verify:
        (message,) = mail.outbox
        link = re.search(r"https?://\S+/accounts/confirm-email/\S+/", str(message.body))
        assert link is not None
        with capture(execute=True):
            client.post(link.group(0).split("testserver")[-1])
    return Membership.objects.get(user=user).organization


def test_the_grant_waits_for_verification_and_comes_once_per_mailbox(
        settings: Settings, django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 250
    # A fresh mailbox each run: allauth rate-limits confirmation mails per address in the
    # shared cache (Redis), which outlives a test.
    name = f"farmer{uuid.uuid4().hex[:8]}"

    def balance(organization: Organization) -> int:
        return credits_summary(organization=organization).balance

    # an unverified sign-up gets nothing
    unverified = sign_up(f"{name}+0@gmail.com", django_capture_on_commit_callbacks,
                         verify=False)
    assert balance(unverified) == 0
    # the first verified one gets the grant
    first = sign_up(f"{name}@gmail.com", django_capture_on_commit_callbacks, verify=True)
    assert balance(first) == 250
    # the same mailbox again, by a +tag, by dots, by case: verified, and nothing
    farmed = [sign_up(address, django_capture_on_commit_callbacks, verify=True)
              for address in (f"{name}+1@gmail.com", f"{name[:3]}.{name[3:]}@gmail.com",
                              f"{name.upper()}+2@googlemail.com")]
    assert [balance(organization) for organization in farmed] == [0, 0, 0]
    # another mailbox is another grant
    assert balance(sign_up(f"{name}@example.com", django_capture_on_commit_callbacks,
                           verify=True)) == 250
