"""Issue 22, L9: staff MFA. A staff account's password alone opened the admin, where every
organization's data and credits are; now the admin sends staff without TOTP to set it up.
Issue 40, L10: and setting it up takes a one-time code issued from a shell, not the
password alone."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import (
    SECRET_SESSION_KEY,
    format_hotp_value,
    hotp_value,
    yield_hotp_counters_from_time,
)
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone
from pytest_django import Settings

from console.models import StaffEnrolment
from tests.db.test_console import PASSWORD, reauthenticate

pytestmark = pytest.mark.django_db


def test_staff_without_totp_are_sent_to_set_it_up(settings: Settings) -> None:
    settings.ANEX_STAFF_MFA_REQUIRED = True
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-1234")
    client = Client()
    # given a staff session made with the password alone
    client.force_login(user)
    # when it opens the admin, a list or an object page
    for path in ("/admin/", "/admin/console/organization/", "/admin/auth/user/"):
        response = client.get(path)
        # then it is sent to set up an authenticator app instead
        assert response.status_code == 302, path
        assert response["Location"] == "/accounts/2fa/totp/activate/", path
    # once TOTP is on (allauth's sign-in then asks for the code), the admin opens
    Authenticator.objects.create(user=user, type=Authenticator.Type.TOTP,
                                 data={"secret": "not-used-here"})
    assert client.get("/admin/").status_code == 200


# Issue 40 L10: TOTP enrolment for staff never by whoever first holds the password -------

ACTIVATE = "/accounts/2fa/totp/activate/"


def staff_signed_in(email: str) -> tuple[Client, Any]:
    """A staff session made with the password alone (and just re-authenticated, as
    allauth's authenticator page asks)."""
    user = get_user_model().objects.create_user(email.split("@")[0], email, PASSWORD,
                                                is_staff=True)
    EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    client = Client()
    client.force_login(user)
    reauthenticate(client)
    return client, user


def app_code(client: Client) -> str:
    """The code an authenticator app shows for the secret the activation page offered."""
    page = client.get(ACTIVATE)
    assert page.status_code == 200
    secret = client.session[SECRET_SESSION_KEY]
    return format_hotp_value(hotp_value(secret, next(yield_hotp_counters_from_time())))


def enrolment_code(email: str) -> str:
    out = io.StringIO()
    call_command("staffenrol", email, stdout=out)
    found = re.search(r"Enrolment code for \S+: (\S+)", out.getvalue())
    assert found is not None, out.getvalue()
    return found.group(1)


def test_the_password_alone_cannot_set_up_a_staff_accounts_authenticator() -> None:
    # given whoever holds a staff account's password, signed in with it
    client, user = staff_signed_in("staff-a@example.com")
    assert "Enrolment code" in client.get(ACTIVATE).content.decode()
    # when they set up their own app: the right app code, but no enrolment code
    refused = client.post(ACTIVATE, {"code": app_code(client)})
    # then no authenticator is theirs
    assert refused.status_code == 200 and "enrolment_code" in refused.context["form"].errors
    assert not Authenticator.objects.filter(user=user).exists()
    # nor with a code issued to another staff account
    enrolment_code_of_other = enrolment_code(staff_signed_in("staff-b@example.com")[1].email)
    client.post(ACTIVATE, {"code": app_code(client), "enrolment_code": enrolment_code_of_other})
    assert not Authenticator.objects.filter(user=user).exists()


def test_a_staff_account_sets_up_its_app_with_the_code_issued_from_a_shell(
        settings: Settings) -> None:
    settings.ANEX_STAFF_MFA_REQUIRED = True
    client, user = staff_signed_in("staff-c@example.com")
    code = enrolment_code(user.email)
    # a wrong app code does not use the enrolment code up
    client.post(ACTIVATE, {"code": "000000", "enrolment_code": code})
    assert not Authenticator.objects.filter(user=user).exists()
    done = client.post(ACTIVATE, {"code": app_code(client), "enrolment_code": code})
    assert done.status_code == 302
    assert Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists()
    assert client.get("/admin/").status_code == 200
    # it works once: turned off, the app is not set up again with the same code
    Authenticator.objects.filter(user=user).delete()
    client.post(ACTIVATE, {"code": app_code(client), "enrolment_code": code})
    assert not Authenticator.objects.filter(user=user).exists()
    # a second code voids the first one issued before it
    first, second = enrolment_code(user.email), enrolment_code(user.email)
    client.post(ACTIVATE, {"code": app_code(client), "enrolment_code": first})
    assert not Authenticator.objects.filter(user=user).exists()
    client.post(ACTIVATE, {"code": app_code(client), "enrolment_code": second})
    assert Authenticator.objects.filter(user=user).exists()


def test_an_expired_code_is_refused_and_the_command_issues_to_staff_only() -> None:
    client, user = staff_signed_in("staff-d@example.com")
    code = enrolment_code(user.email)
    StaffEnrolment.objects.filter(user=user).update(expires_at=timezone.now())
    client.post(ACTIVATE, {"code": app_code(client), "enrolment_code": code})
    assert not Authenticator.objects.filter(user=user).exists()
    customer = get_user_model().objects.create_user("cust", "cust@example.com", PASSWORD)
    with pytest.raises(CommandError, match="not an active staff account"):
        enrolment_code(customer.email)
    # only the code's digest is kept
    assert not StaffEnrolment.objects.filter(code_hash=code).exists()


def test_everyone_else_sets_up_an_app_as_before() -> None:
    user = get_user_model().objects.create_user("cust2", "cust2@example.com", PASSWORD)
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    client = Client()
    client.force_login(user)
    reauthenticate(client)
    assert "Enrolment code" not in client.get(ACTIVATE).content.decode()
    assert client.post(ACTIVATE, {"code": app_code(client)}).status_code == 302
    assert Authenticator.objects.filter(user=user, type=Authenticator.Type.TOTP).exists()
