"""The admin's attack surface (issue 11, item 8): actions need their permission, staff sign
in through allauth's rate-limited login, and ANEX_ADMIN_HOST hides the admin elsewhere."""

from __future__ import annotations

import uuid

import pytest
from allauth.account.models import EmailAddress
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import PermissionDenied
from django.test import Client, RequestFactory
from pytest_django.fixtures import Settings as SettingsWrapper

from billing.models import LedgerEntry
from billing.services import credits_summary
from console.admin import ApiKeyAdmin, OrganizationAdmin
from console.models import ApiKey, Organization
from tests.factories import api_key_make

pytestmark = pytest.mark.django_db
ORGANIZATIONS = "/admin/console/organization/"
KEYS = "/admin/console/apikey/"


def ledger_balance(organization: Organization) -> int:
    total = sum(LedgerEntry.objects.filter(organization=organization)
                .values_list("balance_delta", flat=True))
    assert credits_summary(organization=organization).balance == total
    return total


def staff_with(*codenames: str) -> Client:
    user = get_user_model().objects.create_user(f"staff-{uuid.uuid4().hex[:8]}",
                                                is_staff=True)
    user.user_permissions.set(Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def grant(client: Client, organization: Organization) -> int:
    return client.post(ORGANIZATIONS, {
        "action": "grant_credits", "_selected_action": [str(organization.pk)],
        "apply": "1", "cents": "5000", "reason": "attack"}).status_code


def test_a_view_only_staff_account_cannot_grant_credits(organization: Organization) -> None:
    viewer = staff_with("view_organization")
    before = ledger_balance(organization)
    page = viewer.get(ORGANIZATIONS)
    assert page.status_code == 200
    assert "grant_credits" not in page.content.decode()
    # Posting the action anyway: the admin refuses an action it did not offer.
    grant(viewer, organization)
    assert ledger_balance(organization) == before
    # A staff member who may change organizations still may not write to the ledger.
    editor = staff_with("view_organization", "change_organization")
    grant(editor, organization)
    assert ledger_balance(organization) == before


def test_the_grant_action_checks_its_permission_itself(organization: Organization) -> None:
    user = get_user_model().objects.create_user("viewer", is_staff=True)
    request = RequestFactory().post(ORGANIZATIONS, {"apply": "1", "cents": "5000",
                                                    "reason": "attack"})
    request.user = user
    model_admin = OrganizationAdmin(Organization, admin.site)
    with pytest.raises(PermissionDenied):
        model_admin.grant_credits(request, Organization.objects.filter(pk=organization.pk))
    key, _ = api_key_make(organization)
    with pytest.raises(PermissionDenied):
        ApiKeyAdmin(ApiKey, model_admin.admin_site).revoke(
            request, ApiKey.objects.filter(pk=key.pk))
    key.refresh_from_db()
    assert key.revoked_at is None


def test_staff_with_the_ledger_permission_can_grant(organization: Organization) -> None:
    before = ledger_balance(organization)
    granter = staff_with("view_organization", "add_ledgerentry")
    assert "grant_credits" in granter.get(ORGANIZATIONS).content.decode()
    assert grant(granter, organization) == 302
    assert ledger_balance(organization) == before + 5000


def test_a_view_only_staff_account_cannot_revoke_keys(organization: Organization) -> None:
    key, _ = api_key_make(organization)
    viewer = staff_with("view_apikey")
    assert 'value="revoke"' not in viewer.get(KEYS).content.decode()
    viewer.post(KEYS, {"action": "revoke", "_selected_action": [str(key.pk)]})
    key.refresh_from_db()
    assert key.revoked_at is None
    revoker = staff_with("view_apikey", "change_apikey")
    assert revoker.post(KEYS, {"action": "revoke",
                               "_selected_action": [str(key.pk)]}).status_code == 302
    key.refresh_from_db()
    assert key.revoked_at is not None


def test_the_admin_password_form_is_gone_staff_sign_in_through_allauth() -> None:
    get_user_model().objects.create_superuser("root", "root@example.com", "pw-root-1234")
    client = Client()
    page = client.get("/admin/login/?next=/admin/")
    assert page.status_code == 302
    assert page["Location"] == "/accounts/login/?next=%2Fadmin%2F"
    # Posting a password to the admin's own form signs nobody in.
    client.post("/admin/login/", {"username": "root", "password": "pw-root-1234"})
    assert "_auth_user_id" not in client.session
    # A signed-in user who is not staff is refused, not shown a second login form.
    user = get_user_model().objects.create_user("plain", "plain@example.com", "pw-plain-1")
    client.force_login(user)
    assert client.get("/admin/login/").status_code == 403


def test_allauth_locks_an_account_after_repeated_wrong_passwords() -> None:
    # A fresh address and client address per run: the counters live in the shared Redis.
    email = f"staff-{uuid.uuid4().hex}@example.com"
    user = get_user_model().objects.create_superuser(email.split("@")[0], email,
                                                     "the-right-password-1")
    EmailAddress.objects.create(user=user, email=email, verified=True, primary=True)
    client = Client(REMOTE_ADDR=f"198.51.100.{uuid.uuid4().int % 250 + 1}")
    for _ in range(5):
        client.post("/accounts/login/", {"login": email, "password": "wrong"})
    response = client.post("/accounts/login/", {"login": email,
                                                "password": "the-right-password-1"})
    assert "_auth_user_id" not in client.session
    assert response.status_code in (200, 429)
    assert "Too many failed login attempts" in response.content.decode()


def test_the_admin_is_404_on_any_host_but_the_admin_host(settings: SettingsWrapper) -> None:
    settings.ANEX_ADMIN_HOST = "admin.example.com"
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "admin.example.com"]
    root = get_user_model().objects.create_superuser("root", "root@example.com", "pw-1234")
    client = Client()
    client.force_login(root)
    for path in ["/admin/", "/admin/login/", "/admin/logout/", ORGANIZATIONS, KEYS,
                 "/admin/console/", "/admin/nowhere"]:
        assert client.get(path, HTTP_HOST="api.anex.sh").status_code == 404, path
        assert client.get(path, HTTP_HOST="localhost").status_code == 404, path
    assert client.get("/admin/", HTTP_HOST="admin.example.com").status_code == 200
    assert client.get(ORGANIZATIONS, HTTP_HOST="admin.example.com:443").status_code == 200
    settings.ANEX_ADMIN_HOST = None
    assert client.get("/admin/", HTTP_HOST="localhost").status_code == 200
