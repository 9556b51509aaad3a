"""Issue 11, item 6: auto-approve is made for the key that submitted the job, so that key's
spend budget and model scopes hold; an approval by a key outside the job's model is 403."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from billing.services import Credits, credits_grant, credits_summary, key_spend_cents
from console.actors import Actor
from console.models import ApiKey, AuditEvent, Organization
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.lifecycle import job_approve, job_cost_ready
from tests.factories import SYSTEM, api_key_make, job_make, organization_make, user_make

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"


@pytest.fixture
def funded(settings: Settings) -> Organization:
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make(auto_approve=True)
    credits_grant(organization=organization, cents=1000, reason="t", actor=SYSTEM)
    return organization


def estimated(organization: Organization, key: ApiKey, est: int,
              model: str = "qwen3-embedding-8b") -> Job:
    """A job the key submitted, as the estimator leaves it just before cost_ready."""
    job = job_make(organization, status=JobStatus.ESTIMATING, est_cost_cents=None, model=model)
    Job.objects.filter(pk=job.pk).update(created_by_key=key)
    job_cost_ready(job=Job.objects.get(pk=job.pk), estimate={"est_cost_cents": est})
    return Job.objects.get(pk=job.pk)


def test_auto_approve_over_the_submitting_keys_budget_leaves_the_job_in_cost_ready(
        funded: Organization) -> None:
    # given: a key with 100 credits of budget and 1,000 credits in the organization
    key, _ = api_key_make(funded, spend_budget_cents=100)
    # when: the system approves a 150-credit job that key submitted
    job = estimated(funded, key, est=150)
    # then: the key's budget holds, nothing is held and the ledger is untouched
    assert job.status == JobStatus.COST_READY
    assert job.approved_by_key is None
    assert not LedgerEntry.objects.filter(job=job).exists()
    assert credits_summary(organization=funded) == Credits(balance=1000, held=0)
    assert key_spend_cents(api_key=key) == 0


def test_auto_approve_within_the_budget_is_the_submitting_keys_spend(
        funded: Organization) -> None:
    key, _ = api_key_make(funded, spend_budget_cents=100)
    first = estimated(funded, key, est=70)
    assert (first.status, first.approved_by_key_id) == (JobStatus.IN_PROGRESS, key.pk)
    assert LedgerEntry.objects.get(job=first, kind="hold").api_key_id == key.pk
    assert key_spend_cents(api_key=key) == 70
    event = AuditEvent.objects.get(action="job.approved")
    assert event.actor_label == "system: auto-approve"
    assert event.data["api_key"] == key.display
    # The second job would take the key past its budget: it waits for a person.
    second = estimated(funded, key, est=40)
    assert second.status == JobStatus.COST_READY
    assert credits_summary(organization=funded) == Credits(balance=1000, held=70)
    # A key without a budget is bound by the balance only.
    other, _ = api_key_make(funded)
    assert estimated(funded, other, est=400).status == JobStatus.IN_PROGRESS
    assert credits_summary(organization=funded) == Credits(balance=1000, held=470)


def test_auto_approve_for_a_key_revoked_or_rescoped_since_submit_waits_for_a_person(
        funded: Organization) -> None:
    revoked, _ = api_key_make(funded)
    ApiKey.objects.filter(pk=revoked.pk).update(revoked_at=timezone.now())
    expired, _ = api_key_make(funded)
    ApiKey.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(1))
    rescoped, _ = api_key_make(funded, model_scopes=["gemma4-12b"])
    for key in (revoked, expired, rescoped):
        job = estimated(funded, ApiKey.objects.get(pk=key.pk), est=10)
        assert job.status == JobStatus.COST_READY
    assert credits_summary(organization=funded) == Credits(balance=1000, held=0)


def test_approving_with_a_key_outside_the_jobs_model_is_403(
        funded: Organization, client_for) -> None:  # type: ignore[no-untyped-def]
    funded.auto_approve = False
    funded.save(update_fields=["auto_approve"])
    submitter, _ = api_key_make(funded)
    _scoped, plaintext = api_key_make(funded, model_scopes=["gemma4-12b"])
    job = estimated(funded, submitter, est=10)
    assert job.status == JobStatus.COST_READY
    api: APIClient = client_for(plaintext)
    # when: a key scoped to another model approves it
    response = api.post(f"{JOBS}/{job.pk}/approve")
    # then: 403 in the envelope, naming the model; nothing held, nothing moved
    assert response.status_code == 403, response.content
    assert response.json() == {"detail": (
        "This API key may not use model 'qwen3-embedding-8b' (its model scopes are "
        "gemma4-12b), so it cannot approve this job: approve it with a key scoped to that "
        "model.")}
    job.refresh_from_db()
    assert job.status == JobStatus.COST_READY
    assert credits_summary(organization=funded) == Credits(balance=1000, held=0)
    # A key scoped to the job's model approves it.
    _allowed, allowed_plaintext = api_key_make(funded,
                                               model_scopes=["qwen3-embedding-8b"])
    assert client_for(allowed_plaintext).post(f"{JOBS}/{job.pk}/approve").status_code == 200
    assert credits_summary(organization=funded) == Credits(balance=1000, held=10)


def test_a_persons_approval_is_bound_by_the_balance_only(funded: Organization) -> None:
    # The job auto-approve left in cost_ready is a person's to approve (the console's).
    key, _ = api_key_make(funded, spend_budget_cents=5)
    job = estimated(funded, key, est=10)
    assert job.status == JobStatus.COST_READY
    approved = job_approve(job=job, actor=Actor(user=user_make(funded)))
    assert (approved.status, approved.approved_by_key) == (JobStatus.IN_PROGRESS, None)
    assert credits_summary(organization=funded) == Credits(balance=1000, held=10)
