"""Issue 22, L9: staff MFA. A staff account's password alone opened the admin, where every
organization's data and credits are; now the admin sends staff without TOTP to set it up."""

from __future__ import annotations

import pytest
from allauth.mfa.models import Authenticator
from django.contrib.auth import get_user_model
from django.test import Client
from pytest_django import Settings

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
