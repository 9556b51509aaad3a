"""The credit ledger: grants, the 402 rules, holds placed on approval and settled once."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, InternalError, transaction
from pytest_django.fixtures import Settings as SettingsWrapper

from anex.errors import DomainError
from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import (
    Credits,
    credits_grant,
    credits_require_positive,
    credits_summary,
    hold_open_cents,
    hold_settle,
    key_spend_cents,
)
from console.actors import Actor
from console.models import AuditEvent, Organization
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.lifecycle import job_approve, job_finish
from tests.factories import SYSTEM, api_key_make, job_make, organization_make

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_free_grant(settings: SettingsWrapper) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0


def funded(cents: int) -> Organization:
    organization = organization_make()
    if cents:
        credits_grant(organization=organization, cents=cents, reason="test", actor=SYSTEM)
    return organization


def ledger_sum(organization: Organization) -> Credits:
    rows = LedgerEntry.objects.filter(organization=organization)
    return Credits(balance=sum(r.balance_delta for r in rows), held=sum(r.held_delta for r in rows))


def test_a_new_organization_gets_the_free_grant(settings: SettingsWrapper) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 250
    organization = organization_make()
    assert credits_summary(organization=organization) == Credits(balance=250, held=0)
    entry = LedgerEntry.objects.get(organization=organization)
    assert (entry.kind, entry.reason) == (EntryKind.GRANT, "free grant for a new organization")


def test_grants_add_up_and_are_audited() -> None:
    organization = funded(100)
    credits_grant(organization=organization, cents=40, reason="goodwill", actor=SYSTEM)
    assert credits_summary(organization=organization) == Credits(balance=140, held=0)
    assert credits_summary(organization=organization) == ledger_sum(organization)
    assert AuditEvent.objects.filter(organization=organization,
                                     action="credits.granted").count() == 2


def test_a_grant_with_the_same_idempotency_key_lands_once() -> None:
    organization = funded(0)
    for _ in range(3):
        credits_grant(organization=organization, cents=10, reason="once", actor=SYSTEM,
                      idempotency_key="grant:promo:1")
    assert credits_summary(organization=organization).balance == 10


def test_a_grant_must_be_positive() -> None:
    with pytest.raises(ValueError):
        credits_grant(organization=funded(0), cents=0, reason="x", actor=SYSTEM)


@pytest.mark.parametrize("cents", [0])
def test_zero_or_below_is_402_for_uploads_and_submits(cents: int) -> None:
    with pytest.raises(DomainError) as error:
        credits_require_positive(organization=funded(cents))
    assert error.value.status == 402
    assert "balance is zero or below" in error.value.detail
    credits_require_positive(organization=funded(1))


def test_approval_holds_the_estimate_and_moves_the_job() -> None:
    organization = funded(100)
    job = job_make(organization, est_cost_cents=60)
    key, _ = api_key_make(organization)
    approved = job_approve(job=job, actor=Actor(key=key))
    assert approved.status == JobStatus.IN_PROGRESS and approved.approved_at is not None
    assert approved.approved_by_key == key
    assert credits_summary(organization=organization) == Credits(balance=100, held=60)
    assert credits_summary(organization=organization).available == 40
    assert AuditEvent.objects.get(action="job.approved").actor_key == key


def test_approval_not_covered_is_402_and_changes_nothing() -> None:
    organization = funded(50)
    job = job_make(organization, est_cost_cents=60)
    with pytest.raises(DomainError) as error:
        job_approve(job=job, actor=SYSTEM)
    assert error.value.status == 402
    assert error.value.detail == (
        "The balance does not cover the estimate: approving this job holds 60 credits and 50 "
        "are available. Top up and approve again.")
    job.refresh_from_db()
    assert job.status == JobStatus.COST_READY
    assert credits_summary(organization=organization) == Credits(balance=50, held=0)


def test_other_jobs_holds_count_against_approval() -> None:
    organization = funded(100)
    job_approve(job=job_make(organization, est_cost_cents=70), actor=SYSTEM)
    with pytest.raises(DomainError) as error:
        job_approve(job=job_make(organization, est_cost_cents=40), actor=SYSTEM)
    assert error.value.status == 402


@pytest.mark.parametrize("status", [s for s in JobStatus if s != JobStatus.COST_READY])
def test_approval_outside_cost_ready_is_409(status: JobStatus) -> None:
    organization = funded(100)
    job = job_make(organization, status=status)
    with pytest.raises(DomainError) as error:
        job_approve(job=job, actor=SYSTEM)
    assert error.value.status == 409
    assert error.value.detail == (
        f"This job is {status.value}: only a job in cost_ready can be approved.")
    assert not LedgerEntry.objects.filter(job=job).exists()


def test_a_retried_approval_holds_nothing_twice() -> None:
    organization = funded(100)
    job = job_make(organization, est_cost_cents=30)
    job_approve(job=job, actor=SYSTEM)
    with pytest.raises(DomainError):
        job_approve(job=job, actor=SYSTEM)
    assert LedgerEntry.objects.filter(job=job, kind=EntryKind.HOLD).count() == 1
    assert credits_summary(organization=organization).held == 30


def test_a_key_spend_budget_caps_what_its_approvals_hold() -> None:
    organization = funded(1000)
    key, _ = api_key_make(organization, spend_budget_cents=100)
    job_approve(job=job_make(organization, est_cost_cents=70), actor=Actor(key=key))
    with pytest.raises(DomainError) as error:
        job_approve(job=job_make(organization, est_cost_cents=40), actor=Actor(key=key))
    assert error.value.status == 402
    assert "spend budget" in error.value.detail and "30 are left" in error.value.detail
    # Another key of the same organization is not bound by it.
    other, _ = api_key_make(organization)
    job_approve(job=job_make(organization, est_cost_cents=40), actor=Actor(key=other))


def ran(job: Job) -> Job:
    """An approved job whose rows have run: it finishes from finalizing."""
    Job.objects.filter(pk=job.pk).update(status=JobStatus.FINALIZING)
    return job


def test_finishing_charges_the_cost_and_releases_the_rest() -> None:
    organization = funded(100)
    key, _ = api_key_make(organization, spend_budget_cents=1000)
    job = job_approve(job=job_make(organization, est_cost_cents=60), actor=Actor(key=key))
    assert key_spend_cents(api_key=key) == 60
    finished = job_finish(job=ran(job), status=JobStatus.DONE, cost_cents=25)
    assert (finished.status, finished.cost_cents) == (JobStatus.DONE, 25)
    assert finished.finished_at is not None
    assert credits_summary(organization=organization) == Credits(balance=75, held=0)
    assert hold_open_cents(job=job) == 0
    assert key_spend_cents(api_key=key) == 25
    kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds == ["charge", "hold", "release"]


@pytest.mark.parametrize("status", [JobStatus.FAILED, JobStatus.CANCELLED])
def test_failed_and_cancelled_jobs_settle_too(status: JobStatus) -> None:
    organization = funded(100)
    job = job_approve(job=job_make(organization, est_cost_cents=60), actor=SYSTEM)
    job_finish(job=job, status=status, cost_cents=10, failure_code="internal_error"
               if status == JobStatus.FAILED else "")
    assert credits_summary(organization=organization) == Credits(balance=90, held=0)


def test_finishing_twice_settles_once() -> None:
    organization = funded(100)
    job = job_approve(job=job_make(organization, est_cost_cents=60), actor=SYSTEM)
    job_finish(job=ran(job), status=JobStatus.DONE, cost_cents=20)
    again = job_finish(job=job, status=JobStatus.FAILED, cost_cents=50)
    assert (again.status, again.cost_cents) == (JobStatus.DONE, 20)
    assert hold_settle(job=job, cost_cents=59) == 20
    assert credits_summary(organization=organization) == Credits(balance=80, held=0)


def test_a_job_never_charges_more_than_its_hold() -> None:
    organization = funded(100)
    job = job_approve(job=job_make(organization, est_cost_cents=30), actor=SYSTEM)
    assert job_finish(job=ran(job), status=JobStatus.DONE, cost_cents=45).cost_cents == 30
    assert credits_summary(organization=organization) == Credits(balance=70, held=0)


def test_a_job_cancelled_before_approval_moves_no_money() -> None:
    organization = funded(100)
    job = job_make(organization)
    assert job_finish(job=job, status=JobStatus.CANCELLED).cost_cents == 0
    assert not LedgerEntry.objects.filter(job=job).exists()


def test_the_ledger_is_append_only() -> None:
    organization = funded(100)
    entry = LedgerEntry.objects.get(organization=organization)
    with pytest.raises((InternalError, IntegrityError), match="append-only"):
        with transaction.atomic():
            LedgerEntry.objects.filter(pk=entry.pk).update(balance_delta=1_000_000)
    with pytest.raises((InternalError, IntegrityError), match="append-only"):
        with transaction.atomic():
            LedgerEntry.objects.filter(pk=entry.pk).delete()


@pytest.mark.parametrize("values", [
    {"kind": EntryKind.GRANT, "balance_delta": -5},
    {"kind": EntryKind.HOLD, "held_delta": -5},
    {"kind": EntryKind.CHARGE, "balance_delta": -5, "held_delta": -6},
    {"kind": EntryKind.RELEASE, "held_delta": 5},
])
def test_the_database_refuses_entries_with_the_wrong_signs(values: dict) -> None:  # type: ignore[type-arg]
    organization = funded(0)
    job = job_make(organization)
    with pytest.raises(IntegrityError):
        with transaction.atomic():
            LedgerEntry.objects.create(organization=organization, job=job,
                                       idempotency_key="bad", **values)
