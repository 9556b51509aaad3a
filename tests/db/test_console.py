"""The console's pages over the services (fast tier): sign-up, roles, tenancy (another
organization's objects are 404), and each page's action landing in the same service the
API calls. The browser walk is tests/browser/test_console_browser.py."""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core import mail
from django.test import Client
from django.utils import timezone

from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_summary
from console.constants import Role
from console.models import ApiKey, AuditEvent, Invitation, Membership, Organization
from console.selectors import organization_webhook_secret, spend_per_day
from console.templatetags.console_tags import FORM_ORGANIZATION, duration
from jobs.constants import JobStatus
from jobs.models import Input, Job
from jobs.serializers import JobOut
from jobs.services.webhook_endpoint import organization_webhook_set
from tests.factories import (
    SYSTEM,
    api_key_make,
    input_ready,
    job_make,
    organization_make,
    user_make,
)

pytestmark = pytest.mark.django_db
PASSWORD = "correct horse battery"


def signed_in(organization: Organization, role: Role = Role.OWNER, *,
              reauthenticated: bool = False) -> tuple[Client, User]:
    """A signed-in client; reauthenticated: its password just confirmed again (allauth's
    re-authentication), as creating a key or revealing or rotating the signing secret
    asks (issue 22, L5)."""
    user = user_make(organization, role=role)
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    client = Client()
    client.force_login(user)
    if reauthenticated:
        reauthenticate(client)
    return client, user


def reauthenticate(client: Client) -> None:
    """Confirm the password again, as allauth's re-authentication page does."""
    response = client.post("/accounts/reauthenticate/", {"password": PASSWORD})
    assert response.status_code == 302, response.content.decode()


def form(organization: Organization, fields: dict[str, Any] | None = None) -> dict[str, Any]:
    """A console form's fields with the organization it was rendered for, as every console
    form carries it (console_tags.organization_field)."""
    return {FORM_ORGANIZATION: str(organization.pk), **(fields or {})}


@pytest.fixture
def owner(organization: Organization) -> Client:
    return signed_in(organization)[0]


@pytest.fixture
def member(organization: Organization) -> Client:
    return signed_in(organization, Role.MEMBER)[0]


def ledger_sum(organization: Organization) -> int:
    total = sum(LedgerEntry.objects.filter(organization=organization)
                .values_list("balance_delta", flat=True))
    assert credits_summary(organization=organization).balance == total
    return total


# Sign-up, verification, sign-in ---------------------------------------------------------

def test_sign_up_creates_an_organization_with_the_user_as_owner_and_the_free_grant(
        settings: Any, django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 250
    client = Client()
    # A fresh address each run: allauth rate-limits confirmation mails per address in the
    # shared cache (Redis), which outlives a test.
    email = f"ada-{uuid.uuid4().hex[:8]}@example.com"
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/accounts/signup/", {
            "email": email, "password1": PASSWORD, "password2": PASSWORD})
    assert response.status_code == 302
    user = get_user_model().objects.get(email=email)
    (membership,) = Membership.objects.filter(user=user)
    assert membership.role == Role.OWNER
    # The free grant waits for the address to be verified (issue 22 L8: changed on
    # purpose; the grant was given at sign-up).
    assert ledger_sum(membership.organization) == 0
    # Mandatory verification: nothing of the console until the address is confirmed.
    assert client.get("/console/jobs").status_code == 302
    (message,) = mail.outbox
    link = re.search(r"https?://\S+/accounts/confirm-email/\S+/", str(message.body))
    assert link is not None
    client.post(link.group(0).split("testserver")[-1])
    assert EmailAddress.objects.get(user=user).verified
    assert ledger_sum(membership.organization) == 250
    signed = client.post("/accounts/login/", {"login": email, "password": PASSWORD})
    assert signed.status_code == 302
    page = client.get("/console/jobs")
    assert page.status_code == 200
    assert "No jobs yet — " in page.content.decode()


def test_every_console_page_needs_a_sign_in() -> None:
    for path in ["/console/", "/console/jobs", "/console/jobs/new", "/console/keys",
                 "/console/settings", "/console/members", "/console/billing",
                 "/console/audit", f"/console/jobs/{uuid.uuid4()}"]:
        response = Client().get(path)
        assert response.status_code == 302 and "/accounts/login/" in response["Location"], path


def test_two_factor_can_be_set_up_from_the_account_pages(owner: Client) -> None:
    page = owner.get("/accounts/2fa/")
    assert page.status_code == 200
    assert "/accounts/2fa/totp/activate/" in page.content.decode()
    # Turning it on asks for the password again first (allauth's reauthentication).
    activate = owner.get("/accounts/2fa/totp/activate/")
    assert activate.status_code == 302 and "/accounts/reauthenticate/" in activate["Location"]


# Another organization's objects ----------------------------------------------------------

def test_another_organizations_job_key_and_ledger_are_404(owner: Client,
                                                          organization: Organization) -> None:
    other = organization_make()
    job = job_make(other, status=JobStatus.COST_READY)
    key, _ = api_key_make(other)
    for path in [f"/console/jobs/{job.pk}", f"/console/jobs/{job.pk}?fragment=1",
                 f"/console/jobs/{job.pk}/result", f"/console/jobs/{job.pk}/delete-data",
                 f"/console/keys/{key.pk}/revoke"]:
        assert owner.get(path).status_code == 404, path
    for path in [f"/console/jobs/{job.pk}/approve", f"/console/jobs/{job.pk}/cancel",
                 f"/console/jobs/{job.pk}/delete-data", f"/console/keys/{key.pk}/revoke"]:
        assert owner.post(path, form(organization)).status_code == 404, path
    job.refresh_from_db()
    key.refresh_from_db()
    assert job.status == JobStatus.COST_READY and not job.data_delete_requested
    assert key.revoked_at is None
    # Lists show only the organization's own.
    mine = job_make(organization)
    jobs = owner.get("/console/jobs").content.decode()
    assert str(mine.pk)[:8] in jobs and str(job.pk)[:8] not in jobs
    assert key.prefix not in owner.get("/console/keys").content.decode()
    billing = owner.get("/console/billing").content.decode()
    assert str(other.name) not in billing
    assert owner.post("/console/organization", {"organization": str(other.pk)}).status_code == 404


def test_another_organizations_delivery_is_not_shown(owner: Client) -> None:
    from jobs.services.webhooks import organization_event_enqueue
    other = organization_make()
    organization_webhook_set(organization=other, actor=SYSTEM, url="https://93.184.215.14/x")
    delivery = organization_event_enqueue(organization=other, event_type="test")
    page = owner.get(f"/console/settings?delivery={delivery.pk}").content.decode()
    assert "Test event:" not in page


# Roles -------------------------------------------------------------------------------------

def test_a_member_cannot_open_settings_or_the_audit_log_but_manages_jobs_and_keys(
        member: Client, organization: Organization) -> None:
    assert member.get("/console/settings").status_code == 403
    assert member.post("/console/settings", form(organization, {"action": "auto_approve",
                                             "auto_approve": "on"})).status_code == 403
    assert member.get("/console/audit").status_code == 403
    organization.refresh_from_db()
    assert not organization.auto_approve
    assert member.get("/console/jobs").status_code == 200
    nav = member.get("/console/keys").content.decode()
    assert "/console/settings" not in nav
    # A member's key carries a spend budget (issue 22, M5: tests/db/test_member_roles.py).
    reauthenticate(member)
    assert member.post("/console/keys", form(organization, {"name": "ci", "spend_budget": "5"})
                       ).status_code == 200
    assert ApiKey.objects.for_org(organization).filter(name="ci").exists()
    assert member.post("/console/members", form(organization, {"email": "x@example.com",
                                            "role": "member"})).status_code == 403


def test_a_user_switches_between_their_organizations(organization: Organization) -> None:
    client, user = signed_in(organization)
    second = organization_make(name="Second Org")
    Membership.objects.create(user=user, organization=second, role=Role.MEMBER)
    assert client.get("/console/settings").status_code == 200  # owner of the first
    assert client.post("/console/organization",
                       {"organization": str(second.pk)}).status_code == 302
    page = client.get("/console/jobs").content.decode()
    assert "Second Org" in page
    assert client.get("/console/settings").status_code == 403  # a member of the second


# Keys -----------------------------------------------------------------------------------

def test_a_key_is_created_shown_once_listed_and_revoked_with_a_confirmation(
        owner: Client, organization: Organization) -> None:
    reauthenticate(owner)
    response = owner.post("/console/keys", form(organization, {
        "name": "nightly", "model_scopes": ["qwen3-embedding-8b"], "spend_budget": "12.50",
        "expires_at": (timezone.now() + timedelta(days=30)).date().isoformat()}))
    assert response.status_code == 200 and response["Cache-Control"] == "no-store"
    key = ApiKey.objects.for_org(organization).get(name="nightly")
    assert (key.model_scopes, key.spend_budget_cents) == (["qwen3-embedding-8b"], 1250)
    assert key.expires_at is not None
    first = response.content.decode()
    plaintext = re.search(r'value="(sk-[a-z0-9]{12}_[A-Za-z0-9]{40})"', first)
    assert plaintext is not None and plaintext.group(1).startswith(f"sk-{key.prefix}_")
    assert "sk-" + key.prefix + "_" in first
    second = owner.get("/console/keys").content.decode()
    assert plaintext.group(1) not in second  # shown once
    assert "$12.50" in second and "qwen3-embedding-8b" in second
    confirm = owner.get(f"/console/keys/{key.pk}/revoke")
    assert confirm.status_code == 200 and "cannot be undone" in confirm.content.decode()
    key.refresh_from_db()
    assert key.revoked_at is None  # the confirmation page changes nothing
    owner.post(f"/console/keys/{key.pk}/revoke", form(organization))
    key.refresh_from_db()
    assert key.revoked_at is not None
    actions = set(AuditEvent.objects.for_org(organization).values_list("action", flat=True))
    assert {"api_key.created", "api_key.revoked"} <= actions
    audit = owner.get("/console/audit").content.decode()
    assert "api_key.revoked" in audit


# Jobs -----------------------------------------------------------------------------------

def test_the_job_page_shows_every_field_of_the_api_and_approves_through_the_service(
        owner: Client, organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.COST_READY, est_cost_cents=40)
    page = owner.get(f"/console/jobs/{job.pk}").content.decode()
    for name in JobOut(job).data:
        assert f"<dt>{name}</dt>" in page, name
    assert "Approve $0.40" in page
    response = owner.post(f"/console/jobs/{job.pk}/approve", form(organization))
    assert response.status_code == 302
    job.refresh_from_db()
    assert job.status == JobStatus.IN_PROGRESS and job.approved_by_user is not None
    assert credits_summary(organization=organization).held == 40
    ledger_sum(organization)
    # A repeat is the API's 409, said on the page, holding nothing twice.
    again = owner.post(f"/console/jobs/{job.pk}/approve", form(organization), follow=True,
                       HTTP_REFERER=f"http://testserver/console/jobs/{job.pk}")
    assert "only a job in cost_ready can be approved" in again.content.decode()
    assert credits_summary(organization=organization).held == 40


def test_approval_the_balance_does_not_cover_is_the_apis_402_in_words(
        owner: Client, organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.COST_READY, est_cost_cents=10**6)
    page = owner.post(f"/console/jobs/{job.pk}/approve", form(organization),
                      follow=True).content.decode()
    assert "The balance does not cover the estimate" in page
    job.refresh_from_db()
    assert job.status == JobStatus.COST_READY


def test_cancel_and_delete_data_use_the_lifecycle_services(owner: Client,
                                                           organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.COST_READY)
    owner.post(f"/console/jobs/{job.pk}/cancel", form(organization))
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    confirm = owner.get(f"/console/jobs/{job.pk}/delete-data").content.decode()
    assert "cannot be brought back" in confirm
    owner.post(f"/console/jobs/{job.pk}/delete-data", form(organization))
    job.refresh_from_db()
    assert job.data_deleted_at is not None
    page = owner.get(f"/console/jobs/{job.pk}").content.decode()
    assert "data was deleted" in page and "Delete data</a>" not in page


def test_the_failure_reason_reads_in_plain_words(owner: Client,
                                                 organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.FAILED)
    Job.objects.filter(pk=job.pk).update(failure_code="invalid_input",
                                         failure_reason="Row 'x' is too long.")
    page = owner.get(f"/console/jobs/{job.pk}").content.decode()
    assert "could not be run as it is, and nothing was charged" in page
    assert "Row &#x27;x&#x27; is too long." in page


def test_the_job_list_filters_paginates_and_polls_only_while_something_moves(
        owner: Client, organization: Organization) -> None:
    for _ in range(26):
        job_make(organization, status=JobStatus.DONE, model="all-minilm-l6-v2")
    running = job_make(organization, status=JobStatus.COST_READY, model="tiny-qwen3")
    first = owner.get("/console/jobs")
    assert "Page 1 of 2" in first.content.decode()
    assert str(running.pk)[:8] in first.content.decode()  # newest first
    filtered = owner.get("/console/jobs?status=cost_ready&model=tiny-qwen3").content.decode()
    assert filtered.count("/console/jobs/") - filtered.count("/console/jobs/new") >= 1
    assert "data-poll=" in filtered
    # The pager keeps the filters.
    done = owner.get("/console/jobs?status=done&model=all-minilm-l6-v2").content.decode()
    assert 'href="?status=done&amp;model=all-minilm-l6-v2&amp;page=2"' in done
    fragment = owner.get("/console/jobs?status=done&fragment=1")
    assert fragment["X-Console-Live"] == "0"
    assert owner.get("/console/jobs?status=done&model=nope").content.decode().count(
        "No jobs match these filters") == 1


def test_an_upload_target_is_the_apis_and_needs_credits(owner: Client,
                                                        organization: Organization) -> None:
    response = owner.post("/console/jobs/upload", form(organization, {"format": "jsonl"}))
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"id", "upload_url", "fields"} and body["fields"]
    item = Input.objects.for_org(organization).get(pk=body["id"])
    assert item.status == "awaiting_upload" and item.created_by_key is None
    broke = organization_make()
    LedgerEntry.objects.create(organization=broke, kind=EntryKind.ADJUSTMENT,
                               balance_delta=-credits_summary(organization=broke).balance,
                               idempotency_key=f"test:{broke.pk}")
    client, _user = signed_in(broke)
    refused = client.post("/console/jobs/upload", form(broke, {"format": "jsonl"}))
    assert refused.status_code == 402 and "detail" in refused.json()


def test_a_job_is_submitted_from_the_form_with_the_fields_the_model_takes(
        owner: Client, organization: Organization, settings: Any, tokenizer_dir: Any) -> None:
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": tokenizer_dir}
    item = input_ready(organization, b'{"custom_id": "a", "method": "POST", "url": '
                                     b'"/v1/chat/completions", "body": {"messages": []}}\n')
    response = owner.post("/console/jobs/new", form(organization, {
        "input_id": str(item.pk), "model": "tiny-qwen3", "reasoning_shown": "on",
        "reasoning": "on", "reasoning_effort": "low", "max_output_tokens": "256",
        "reasoning_budget": "64"}))
    assert response.status_code == 302
    job = Job.objects.for_org(organization).get()
    assert response["Location"] == f"/console/jobs/{job.pk}"
    assert (job.model, job.reasoning, job.reasoning_effort, job.max_output_tokens,
            job.reasoning_budget) == ("tiny-qwen3", True, "low", 256, 64)
    # The API's own 422, in words, for a field the model does not take; nothing created.
    page = owner.post("/console/jobs/new", form(organization, {
        "input_id": str(item.pk), "model": "tiny-qwen3", "dimensions": "64"})).content.decode()
    assert "dimensions is for embedding models" in page
    assert Job.objects.for_org(organization).count() == 1
    # Another organization's upload reads as not found.
    foreign = input_ready(organization_make(), b'{"custom_id": "a"}\n')
    page = owner.post("/console/jobs/new", form(organization, {"input_id": str(foreign.pk),
                                            "model": "tiny-qwen3"})).content.decode()
    assert "not one of this organization" in page


def test_the_model_dropdown_offers_the_catalog_with_what_each_model_takes(
        owner: Client, settings: Any) -> None:
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": "/nowhere"}
    page = owner.get("/console/jobs/new").content.decode()
    assert 'value="tiny-qwen3" data-task="chat" data-reasoning' in page
    assert 'value="qwen3-embedding-8b" data-task="embed"' in page
    assert 'value="laya" data-task="decide"' in page
    assert 'value="all-minilm-l6-v2"' not in page  # a local model this deployment lacks


# Settings and members ----------------------------------------------------------------------

def test_owner_settings_auto_approve_webhook_and_secret_rotation(
        owner: Client, organization: Organization) -> None:
    # Turning auto-approve on and setting the endpoint ask for it too (issue 40 L1:
    # tests/db/test_owner_actions.py).
    reauthenticate(owner)
    owner.post("/console/settings", form(organization, {"action": "auto_approve",
                                                        "auto_approve": "on"}))
    organization.refresh_from_db()
    assert organization.auto_approve
    owner.post("/console/settings", form(organization, {"action": "auto_approve"}))
    organization.refresh_from_db()
    assert not organization.auto_approve
    refused = owner.post("/console/settings", form(organization, {"action": "webhook",
                                               "webhook_url": "http://example.com/hook"}))
    assert "The webhook endpoint cannot be used" in refused.content.decode()
    organization_webhook_set(organization=organization, actor=SYSTEM,
                             url="https://93.184.215.14/hook")
    before = organization_webhook_secret(organization=organization)
    shown = owner.get("/console/settings")
    page = shown.content.decode()
    # Not in the page a GET answers (issue 22, L5): Reveal POSTs for it
    # (tests/db/test_console_hardening.py).
    assert before is not None and before not in page and "Reveal the signing secret" in page
    assert shown["Cache-Control"] == "no-store"
    owner.post("/console/settings", form(organization, {"action": "rotate"}))
    after = organization_webhook_secret(organization=organization)
    assert after != before
    assert "EU data routing" in page and "contact us" in page
    actions = set(AuditEvent.objects.for_org(organization).values_list("action", flat=True))
    assert {"organization.updated", "webhook.secret_rotated"} <= actions


def test_an_owner_cannot_turn_on_eu_routing_themselves(organization: Organization) -> None:
    from django.core.exceptions import PermissionDenied

    from console.actors import Actor
    from console.services import organization_update
    user = user_make(organization, role=Role.OWNER)
    with pytest.raises(PermissionDenied):
        organization_update(organization=organization, actor=Actor(user=user),
                            eu_data_routing=True)


def test_an_invitation_is_mailed_and_accepted_by_its_verified_address(
        owner: Client, organization: Organization,
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        response = owner.post("/console/members", form(organization, {"email": "Bob@Example.com",
                                                   "role": "member"}))
    assert response.status_code == 302
    (message,) = mail.outbox
    assert message.to == ["bob@example.com"]
    link = re.search(r"http://testserver(/console/invitations/\S+)", str(message.body))
    assert link is not None
    invitation = Invitation.objects.for_org(organization).get()
    assert invitation.token_hash not in message.body  # only the token's digest is stored
    # Someone else, signed in, cannot take it.
    stranger, _ = signed_in(organization_make())
    stranger.post(link.group(1))
    assert not Membership.objects.filter(organization=organization,
                                         user__email="bob@example.com").exists()
    bob_client, bob = signed_in(organization_make())
    get_user_model().objects.filter(pk=bob.pk).update(email="bob@example.com")
    EmailAddress.objects.filter(user=bob).update(email="bob@example.com")
    assert bob_client.post(link.group(1)).status_code == 302
    assert Membership.objects.get(organization=organization, user=bob).role == Role.MEMBER
    assert bob_client.get("/console/settings").status_code == 403  # now acting as member
    assert bob_client.get(link.group(1)).status_code == 404  # used once


def test_spend_per_day_sums_the_days_charges(organization: Organization, owner: Client) -> None:
    job = job_make(organization, status=JobStatus.IN_PROGRESS)
    LedgerEntry.objects.create(organization=organization, kind=EntryKind.CHARGE,
                               balance_delta=-7, held_delta=0, job=job,
                               idempotency_key=f"test:{job.pk}:charge")
    days, spent = spend_per_day(organization=organization)
    assert len(days) == 30 and days[-1] == timezone.localdate()
    assert spent == {(timezone.localdate(), job.model): 7}
    page = owner.get("/console/billing").content.decode()
    assert "<svg" in page and "7 credits" in page
    assert f"/console/jobs/{job.pk}" in page  # the ledger entry links its job


def test_an_eta_reads_in_seconds_then_whole_minutes() -> None:
    assert [duration(s) for s in (None, 0, 59, 90, 3599, 7199, 7260)] == [
        "—", "1 s", "59 s", "2 min", "1 h 0 min", "2 h 0 min", "2 h 1 min"]
