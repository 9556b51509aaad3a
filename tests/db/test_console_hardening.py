"""The console's hardening (issue 22, L5): each test performs the attack and sees it fail
safely.

- a Content-Security-Policy without 'unsafe-inline' on every console and account page, and
  nothing inline left in them for it to block;
- the webhook signing secret only in the answer to an owner's Reveal (a POST), never in
  the Settings page a GET answers;
- re-authentication (allauth's) before revealing or rotating the secret and creating a key;
- "rotate now, no grace": the old secret stops signing at once;
- "Send a test event" throttled per organization, failing closed;
- a form rendered for one organization refused once the session acts in another.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from allauth.account import app_settings as allauth_settings
from django.test import Client
from pytest_django import Settings

from anex.csp import HEADER
from anex.redis import client_for
from console.constants import AuditAction, Role
from console.models import ApiKey, AuditEvent, Membership, Organization
from console.selectors import organization_webhook_secret
from console.templatetags.console_tags import FORM_ORGANIZATION
from jobs.models import WebhookDelivery
from jobs.services.webhook_endpoint import organization_webhook_set
from jobs.services.webhooks import organization_signing_secrets
from tests.db.test_console import form, signed_in
from tests.factories import SYSTEM, api_key_make, job_make, organization_make

pytestmark = pytest.mark.django_db
SETTINGS = "/console/settings"
KEYS = "/console/keys"
ENDPOINT = "https://93.184.215.14/hook"  # a public address literal: no lookup


@pytest.fixture
def hooked(organization: Organization) -> Organization:
    organization_webhook_set(organization=organization, actor=SYSTEM, url=ENDPOINT)
    return organization


def directives(response: Any) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for part in response[HEADER].split(";"):
        name, *sources = part.split()
        found[name] = sources
    return found


# Content-Security-Policy ------------------------------------------------------------------

INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)(?![^>]*type=\"application/json\")[^>]*>",
                           re.IGNORECASE)
INLINE_HANDLER = re.compile(r"<[^>]*\son[a-z]+\s*=", re.IGNORECASE)
INLINE_STYLE = re.compile(r"<style\b|<[^>]*\sstyle\s*=", re.IGNORECASE)


def assert_strict(response: Any, path: str) -> None:
    assert response.status_code == 200, path
    policy = directives(response)
    for directive in ("script-src", "style-src", "default-src"):
        assert policy[directive] == ["'self'"], (path, directive, policy)
    assert "'unsafe-inline'" not in response[HEADER] and "'unsafe-eval'" not in response[HEADER]
    assert policy["object-src"] == ["'none'"] and policy["frame-ancestors"] == ["'none'"]
    page = response.content.decode()
    for kind, pattern in (("script", INLINE_SCRIPT), ("handler", INLINE_HANDLER),
                          ("style", INLINE_STYLE)):
        assert not pattern.search(page), (path, kind, pattern.search(page))


def test_every_console_and_account_page_is_strict_and_has_nothing_inline(
        organization: Organization, hooked: Organization) -> None:
    owner, _ = signed_in(organization, reauthenticated=True)
    job = job_make(organization)
    key, _ = api_key_make(organization)
    pages = ["/console/jobs", f"/console/jobs/{job.pk}", f"/console/jobs/{job.pk}?fragment=1",
             "/console/jobs/new", f"/console/jobs/{job.pk}/delete-data", KEYS,
             f"/console/keys/{key.pk}/revoke", SETTINGS, "/console/members",
             "/console/billing", "/console/audit", "/accounts/email/", "/accounts/2fa/",
             "/accounts/password/change/", "/accounts/reauthenticate/",
             "/accounts/2fa/totp/activate/"]
    for path in pages:
        assert_strict(owner.get(path), path)
    # the pages that show a secret, as their POSTs answer them
    assert_strict(owner.post(KEYS, form(organization, {"name": "csp"})), "new key")
    assert_strict(owner.post(SETTINGS, form(organization, {"action": "reveal"})), "reveal")
    for path in ["/", "/accounts/login/", "/accounts/signup/", "/accounts/password/reset/",
                 "/docs/"]:
        assert_strict(Client().get(path), path)


def test_the_new_job_page_may_reach_its_regions_upload_target_and_nothing_else(
        organization: Organization, settings: Settings) -> None:
    settings.ANEX_API_ORIGIN = "https://uploads.example.test"
    owner, _ = signed_in(organization)
    assert directives(owner.get("/console/jobs/new"))["connect-src"] == [
        "'self'", "https://uploads.example.test"]
    assert directives(owner.get("/console/jobs"))["connect-src"] == ["'self'"]


# The signing secret -----------------------------------------------------------------------

def test_the_settings_page_does_not_carry_the_secret_and_reveal_is_an_owners_post(
        organization: Organization, hooked: Organization) -> None:
    secret = organization_webhook_secret(organization=organization)
    assert secret is not None
    owner, _ = signed_in(organization, reauthenticated=True)
    page = owner.get(SETTINGS)
    assert secret not in page.content.decode()
    assert "Reveal the signing secret" in page.content.decode()
    # a member (who could read an owner's page from a shared cache, or guess the action)
    member, _ = signed_in(organization, Role.MEMBER, reauthenticated=True)
    refused = member.post(SETTINGS, form(organization, {"action": "reveal"}))
    assert refused.status_code == 403 and secret not in refused.content.decode()
    # a GET does not reveal, whatever it asks
    assert secret not in owner.get(f"{SETTINGS}?action=reveal").content.decode()
    # a cross-site POST without the CSRF token is refused
    csrf_checked = Client(enforce_csrf_checks=True)
    csrf_checked.cookies = owner.cookies
    assert csrf_checked.post(SETTINGS, form(organization, {"action": "reveal"})
                             ).status_code == 403
    # the owner's Reveal answers it, for no cache to keep
    revealed = owner.post(SETTINGS, form(organization, {"action": "reveal"}))
    assert revealed.status_code == 200 and revealed["Cache-Control"] == "no-store"
    assert f'value="{secret}"' in revealed.content.decode()


# Re-authentication ------------------------------------------------------------------------

SENSITIVE = {
    "reveal": (SETTINGS, {"action": "reveal"}),
    "rotate": (SETTINGS, {"action": "rotate"}),
    "rotate now": (SETTINGS, {"action": "rotate_now"}),
    "create a key": (KEYS, {"name": "sensitive"}),
}


def age_reauthentication(client: Client, seconds: float) -> None:
    """Move the session's authentication records (allauth's) `seconds` into the past."""
    session = client.session
    records = session["account_authentication_methods"]
    assert any(record.get("reauthenticated") for record in records)
    for record in records:
        record["at"] -= seconds
    session["account_authentication_methods"] = records
    session.save()


def performed(organization: Organization, what: str, before: str | None) -> bool:
    if what == "create a key":
        return ApiKey.objects.filter(organization=organization, name="sensitive").exists()
    if what == "reveal":
        return False  # read in the answer instead
    return organization_webhook_secret(organization=organization) != before


@pytest.mark.parametrize("what", list(SENSITIVE))
def test_a_stale_session_is_sent_to_reauthenticate_and_nothing_is_done(
        organization: Organization, hooked: Organization, what: str) -> None:
    path, fields = SENSITIVE[what]
    secret = organization_webhook_secret(organization=organization)
    timeout = allauth_settings.REAUTHENTICATION_TIMEOUT
    never, _ = signed_in(organization)  # signed in, never asked again
    stale, _ = signed_in(organization, reauthenticated=True)
    age_reauthentication(stale, timeout + 1)
    for client in (never, stale):
        response = client.post(path, form(organization, fields))
        assert response.status_code == 302, what
        assert response["Location"].startswith("/accounts/reauthenticate/?next=")
        assert secret is not None and secret not in response.content.decode()
        assert not performed(organization, what, secret)
    # a session re-authenticated just inside the timeout proceeds
    fresh, _ = signed_in(organization, reauthenticated=True)
    age_reauthentication(fresh, timeout - 30)
    answer = fresh.post(path, form(organization, fields))
    if what == "reveal":
        assert f'value="{secret}"' in answer.content.decode()
    else:
        assert performed(organization, what, secret)


def test_the_suspended_form_is_sent_once_the_password_is_confirmed(
        organization: Organization) -> None:
    owner, _ = signed_in(organization)
    asked = owner.post(KEYS, form(organization, {"name": "after confirming"}))
    assert asked["Location"].startswith("/accounts/reauthenticate/")
    assert not ApiKey.objects.filter(name="after confirming").exists()
    # allauth's page replays the suspended POST once the password is right
    shown = owner.post(asked["Location"], {"password": "correct horse battery"})
    assert ApiKey.objects.filter(organization=organization, name="after confirming").exists()
    assert shown["Cache-Control"] == "no-store" and 'id="new-key"' in shown.content.decode()


# Rotation ---------------------------------------------------------------------------------

def test_rotation_keeps_the_old_secret_for_a_day_and_rotate_now_drops_it(
        organization: Organization, hooked: Organization) -> None:
    owner, _ = signed_in(organization, reauthenticated=True)
    first = organization_webhook_secret(organization=organization)
    owner.post(SETTINGS, form(organization, {"action": "rotate"}))
    organization.refresh_from_db()
    second = organization_webhook_secret(organization=organization)
    assert organization_signing_secrets(organization) == [second, first]
    # the secret leaked: rotate now, and neither earlier one signs any more
    page = owner.post(SETTINGS, form(organization, {"action": "rotate_now"}), follow=True)
    assert "stopped signing now" in page.content.decode()
    organization.refresh_from_db()
    third = organization_webhook_secret(organization=organization)
    assert third not in (first, second)
    assert organization_signing_secrets(organization) == [third]
    assert organization.webhook_secret_previous_encrypted == ""
    rotations = AuditEvent.objects.filter(organization=organization,
                                          action=AuditAction.WEBHOOK_SECRET_ROTATED)
    assert sorted(event.data["previous_valid_hours"] for event in rotations) == [0, 24]


# The test event ---------------------------------------------------------------------------

def test_the_sixth_test_event_in_a_minute_is_refused_and_not_sent(
        organization: Organization, hooked: Organization, settings: Settings) -> None:
    assert settings.ANEX_WEBHOOK_TESTS_PER_MINUTE == 5
    owner, _ = signed_in(organization)
    for _n in range(5):
        assert owner.post(SETTINGS, form(organization, {"action": "test"})).status_code == 302
    refused = owner.post(SETTINGS, form(organization, {"action": "test"}), follow=True)
    assert "Too many test events: an organization may send 5 a minute" in \
        refused.content.decode()
    assert WebhookDelivery.objects.filter(organization=organization).count() == 5
    assert AuditEvent.objects.filter(organization=organization,
                                     action=AuditAction.WEBHOOK_TEST_SENT).count() == 5
    # another organization is not held by it
    other = organization_make()
    organization_webhook_set(organization=other, actor=SYSTEM, url=ENDPOINT)
    theirs, _ = signed_in(other)
    theirs.post(SETTINGS, form(other, {"action": "test"}))
    assert WebhookDelivery.objects.filter(organization=other).count() == 1


def test_the_test_event_fails_closed_without_redis(
        organization: Organization, hooked: Organization,
        monkeypatch: pytest.MonkeyPatch) -> None:
    owner, _ = signed_in(organization)
    closed = client_for("redis://127.0.0.1:1/0")  # the product's client, nothing listening
    monkeypatch.setattr("anex.redis.redis_client", lambda: closed)
    page = owner.post(SETTINGS, form(organization, {"action": "test"}), follow=True)
    assert "nothing was done" in page.content.decode()
    assert not WebhookDelivery.objects.filter(organization=organization).exists()


# A form and its organization --------------------------------------------------------------

def rendered_field(page: str) -> str:
    found = re.search(rf'name="{FORM_ORGANIZATION}" value="([0-9a-f-]{{36}})"', page)
    assert found is not None
    return found.group(1)


def test_a_form_rendered_for_one_organization_is_refused_in_another(
        organization: Organization) -> None:
    client, user = signed_in(organization, reauthenticated=True)
    second = organization_make(name="Second Org")
    Membership.objects.create(user=user, organization=second, role=Role.OWNER)
    # the Keys and Settings pages, rendered for the first organization (one tab)
    keys_field = rendered_field(client.get(KEYS).content.decode())
    settings_field = rendered_field(client.get(SETTINGS).content.decode())
    assert keys_field == settings_field == str(organization.pk)
    # the user switches to the second in another tab
    assert client.post("/console/organization",
                       {"organization": str(second.pk)}).status_code == 302
    # then submits the first tab's forms: nothing is done, in either organization
    refused = client.post(KEYS, {FORM_ORGANIZATION: keys_field, "name": "stale tab"},
                          follow=True)
    assert "Nothing was done: that page was opened for another organization" in \
        refused.content.decode()
    assert "Second Org" in refused.content.decode()
    client.post(SETTINGS, {FORM_ORGANIZATION: settings_field, "action": "name",
                           "name": "Renamed from a stale tab"})
    client.post(SETTINGS, {FORM_ORGANIZATION: settings_field, "action": "auto_approve",
                           "auto_approve": "on"})
    assert not ApiKey.objects.filter(name="stale tab").exists()
    for each in (organization, second):
        each.refresh_from_db()
        assert each.name != "Renamed from a stale tab" and not each.auto_approve
    # a POST that names no organization is refused the same way
    client.post(KEYS, {"name": "no field"})
    assert not ApiKey.objects.filter(name="no field").exists()
    # the second organization's own page works
    assert rendered_field(client.get(KEYS).content.decode()) == str(second.pk)
    client.post(KEYS, form(second, {"name": "in the second"}))
    assert ApiKey.objects.filter(organization=second, name="in the second").exists()


def test_every_console_form_carries_its_organization(organization: Organization,
                                                     settings: Settings) -> None:
    settings.STRIPE_SECRET_KEY = "sk_test_fake"  # the top-up form shows
    owner, _ = signed_in(organization)
    organization_webhook_set(organization=organization, actor=SYSTEM, url=ENDPOINT)
    job = job_make(organization)
    key, _ = api_key_make(organization)
    Membership.objects.create(user=signed_in(organization_make())[1],
                              organization=organization, role=Role.MEMBER)
    for path in [f"/console/jobs/{job.pk}", "/console/jobs/new", KEYS,
                 f"/console/keys/{key.pk}/revoke", f"/console/jobs/{job.pk}/delete-data",
                 SETTINGS, "/console/members", "/console/billing"]:
        page = owner.get(path).content.decode()
        forms = re.findall(r"<form\b[^>]*method=\"post\".*?</form>", page, re.DOTALL)
        assert forms, path
        for each in forms:
            if "console/organization" in each:  # the switcher names the one to switch to
                continue
            assert f'name="{FORM_ORGANIZATION}" value="{organization.pk}"' in each, (path, each)
