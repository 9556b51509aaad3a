"""The admin lists organizations, members, keys (never a secret) and the audit log."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from billing.models import LedgerEntry
from billing.services import credits_summary
from console.keys import key_parse
from console.models import ApiKey, AuditEvent, Organization
from tests.factories import api_key_make, user_make

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff() -> Client:
    user = get_user_model().objects.create_superuser("staff", "staff@example.com", "pw-staff-1")
    client = Client()
    client.force_login(user)
    return client


def test_the_key_pages_never_show_the_secret_or_its_hash(staff: Client,
                                                         organization: Organization) -> None:
    key, plaintext = api_key_make(organization, name="ci key")
    secret = key_parse(plaintext).secret  # type: ignore[union-attr]
    pages = [
        staff.get("/admin/console/apikey/"),
        staff.get(f"/admin/console/apikey/{key.pk}/change/"),
        staff.get(f"/admin/console/organization/{organization.pk}/change/"),
    ]
    for page in pages:
        assert page.status_code == 200
        html = page.content.decode()
        assert secret not in html and key.secret_hash not in html
        assert key.prefix in html


def test_the_lists_render(staff: Client, organization: Organization) -> None:
    user_make(organization)
    for path in ["/admin/", "/admin/console/organization/", "/admin/console/membership/",
                 "/admin/console/apikey/", "/admin/console/auditevent/"]:
        assert staff.get(path).status_code == 200, path
    assert organization.name in staff.get("/admin/console/organization/").content.decode()
    assert "owner" in staff.get("/admin/console/membership/").content.decode().lower()


def test_the_audit_log_is_read_only(staff: Client, organization: Organization) -> None:
    event = AuditEvent.objects.for_org(organization).first()
    assert event is not None
    assert staff.get(f"/admin/console/auditevent/{event.pk}/change/").status_code == 200
    assert staff.get("/admin/console/auditevent/add/").status_code == 403
    response = staff.post(f"/admin/console/auditevent/{event.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403


def test_staff_edits_go_through_the_service_and_are_audited(staff: Client,
                                                             organization: Organization) -> None:
    response = staff.post(f"/admin/console/organization/{organization.pk}/change/", {
        "name": organization.name, "webhook_url": "", "eu_data_routing": "on",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    organization.refresh_from_db()
    assert organization.eu_data_routing
    event = AuditEvent.objects.for_org(organization).get(action="organization.updated")
    assert event.actor_label == "user staff"


def test_staff_can_create_an_organization(staff: Client) -> None:
    response = staff.post("/admin/console/organization/add/", {
        "name": "Made by staff", "webhook_url": "",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    organization = Organization.objects.get(name="Made by staff")
    assert AuditEvent.objects.for_org(organization).get(
        action="organization.created").actor_label == "user staff"


def test_revoke_action(staff: Client, organization: Organization) -> None:
    key, _ = api_key_make(organization)
    response = staff.post("/admin/console/apikey/", {
        "action": "revoke", "_selected_action": [str(key.pk)]})
    assert response.status_code == 302
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None
    assert AuditEvent.objects.get(action="api_key.revoked",
                                  target_id=str(key.pk)).actor_label == "user staff"


def test_staff_grant_credits_with_a_reason(staff: Client, organization: Organization) -> None:
    before = credits_summary(organization=organization).balance
    form = staff.post("/admin/console/organization/", {
        "action": "grant_credits", "_selected_action": [str(organization.pk)]})
    assert form.status_code == 200 and "Grant credits" in form.content.decode()
    response = staff.post("/admin/console/organization/", {
        "action": "grant_credits", "_selected_action": [str(organization.pk)],
        "apply": "Grant", "cents": "300", "reason": "outage make-good"})
    assert response.status_code == 302
    assert credits_summary(organization=organization).balance == before + 300
    entry = LedgerEntry.objects.get(organization=organization, reason="outage make-good")
    assert entry.staff_user is not None and entry.staff_user.username == "staff"
    page = staff.get(f"/admin/console/organization/{organization.pk}/change/").content.decode()
    assert f"{before + 300} / 0 / {before + 300}" in page


def test_the_ledger_admin_is_read_only(staff: Client, organization: Organization) -> None:
    entry = LedgerEntry.objects.for_org(organization).first()
    assert entry is not None
    assert staff.get("/admin/billing/ledgerentry/").status_code == 200
    assert staff.get(f"/admin/billing/ledgerentry/{entry.pk}/change/").status_code == 200
    assert staff.get("/admin/billing/ledgerentry/add/").status_code == 403
    assert staff.post(f"/admin/billing/ledgerentry/{entry.pk}/delete/",
                      {"post": "yes"}).status_code == 403


def test_staff_cannot_save_a_webhook_url_that_is_not_https(staff: Client,
                                                           organization: Organization) -> None:
    response = staff.post(f"/admin/console/organization/{organization.pk}/change/", {
        "name": organization.name, "webhook_url": "http://example.com/hooks",
        "memberships-TOTAL_FORMS": "0", "memberships-INITIAL_FORMS": "0",
        "api_keys-TOTAL_FORMS": "0", "api_keys-INITIAL_FORMS": "0",
    })
    assert response.status_code == 200
    assert "only https URLs are allowed" in response.content.decode()
    organization.refresh_from_db()
    assert organization.webhook_url == ""
