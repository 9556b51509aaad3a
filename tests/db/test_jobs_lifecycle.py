"""GET /jobs/{id}, approve and cancel over HTTP, the 24-hour expiry and auto-approve."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.services import credits_grant, credits_summary
from console.models import ApiKey, AuditEvent, Organization
from jobs.constants import CANCELLABLE, JOB_TRANSITIONS, TERMINAL_STATUSES, JobStatus
from jobs.models import Job, JobEvent
from jobs.services.lifecycle import job_approve, job_auto_approve, job_transition
from jobs.services.recovery import APPROVAL, lease_recover
from tests.factories import SYSTEM, api_key_make, job_make, organization_make
from tests.product import writers

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"


@pytest.fixture(autouse=True)
def funded(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 1000


def test_get_reports_every_field_of_the_reference(api: APIClient,
                                                  organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.COST_READY, est_cost_cents=72,
                   model="qwen3.8-27b")
    Job.objects.filter(pk=job.pk).update(est_input_tok=120_000, est_output_tok=40_000,
                                         est_processing_seconds=900, max_output_tokens=600,
                                         reasoning=True)
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert list(body) == [
        "id", "status", "est_input_tok", "est_output_tok", "est_cost_cents",
        "est_processing_seconds", "max_output_tokens", "reasoning_budget", "success_rows",
        "error_rows", "format_error_rows", "truncated_rows", "pending_rows", "created_at",
        "approved_at", "data_expires_at", "partial", "failure_code", "failure_reason",
        "model", "reasoning", "reasoning_effort", "task_type", "format", "response_format",
        "dimensions", "video_fps", "data_residency", "data_deleted_at",
        # anex's own, after the reference's: what the rows share (docs/estimates.md)
        "est_shared_prefix_share", "est_identical_rows", "cached_input_tok",
        # the urgency tier (docs/estimates.md, "Urgency tiers")
        "priority", "completion_window_hours", "promoted_at"]
    assert (body["est_shared_prefix_share"], body["est_identical_rows"],
            body["cached_input_tok"]) == (None, None, 0)
    assert (body["priority"], body["completion_window_hours"], body["promoted_at"]) == (
        "standard", 24, None)
    assert body["status"] == "cost_ready"
    assert (body["est_input_tok"], body["est_output_tok"], body["est_cost_cents"]) == (
        120_000, 40_000, 72)
    assert (body["est_processing_seconds"], body["max_output_tokens"]) == (900, 600)
    for count in ("success_rows", "error_rows", "format_error_rows", "truncated_rows",
                  "pending_rows"):
        assert body[count] is None  # null until the job has finished
    assert body["created_at"].endswith("+00:00")
    assert (body["failure_code"], body["reasoning_effort"], body["data_residency"]) == (
        None, None, "world")


def test_an_embedding_job_reports_zero_output_cap_and_no_budget(api: APIClient,
                                                                organization: Organization) -> None:
    job = job_make(organization, model="qwen3-embedding-8b")
    Job.objects.filter(pk=job.pk).update(max_output_tokens=0, task_type="embed",
                                         reasoning_budget=5)
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert (body["max_output_tokens"], body["reasoning_budget"], body["task_type"]) == (
        0, None, "embed")


def test_approve_holds_the_estimate(api: APIClient, api_key: ApiKey,
                                    organization: Organization) -> None:
    job = job_make(organization, est_cost_cents=300)
    response = api.post(f"{JOBS}/{job.pk}/approve")
    assert (response.status_code, response.json()) == (200, {"id": str(job.pk),
                                                             "status": "in_progress"})
    assert credits_summary(organization=organization).held == 300
    assert api.get(f"{JOBS}/{job.pk}").json()["approved_at"] is not None
    again = api.post(f"{JOBS}/{job.pk}/approve")
    assert again.status_code == 409
    assert credits_summary(organization=organization).held == 300


def test_approve_not_covered_is_402(api: APIClient, organization: Organization) -> None:
    job = job_make(organization, est_cost_cents=5000)
    response = api.post(f"{JOBS}/{job.pk}/approve")
    assert response.status_code == 402
    assert response.json()["detail"].startswith("The balance does not cover the estimate")


@pytest.mark.parametrize("status,expected,code", [
    (JobStatus.COST_READY, "cancelled", 200),
    (JobStatus.IN_PROGRESS, "cancelled", 200),  # no chunk running yet: no work in flight
    (JobStatus.CANCELLING, "cancelling", 200),
    (JobStatus.SUBMITTED, None, 409),
    (JobStatus.ESTIMATING, None, 409),
    (JobStatus.FINALIZING, None, 409),
    (JobStatus.DONE, None, 409),
    (JobStatus.FAILED, None, 409),
    (JobStatus.CANCELLED, None, 409),
])
def test_cancel_follows_the_reference(api: APIClient, organization: Organization,
                                      status: JobStatus, expected: str | None,
                                      code: int) -> None:
    job = job_make(organization, status=status)
    response = api.post(f"{JOBS}/{job.pk}/cancel")
    assert response.status_code == code
    if expected:
        assert response.json() == {"id": str(job.pk), "status": expected}
    elif status in (JobStatus.SUBMITTED, JobStatus.ESTIMATING):
        assert response.json()["detail"].startswith(f"This job is {status.value}: wait for "
                                                    "cost_ready and simply never approve it")
    else:
        assert response.json()["detail"] == (f"This job is {status.value}: it is too late to "
                                             "cancel it.")


def test_an_eu_job_cancels_while_estimating(client_for) -> None:  # type: ignore[no-untyped-def]
    organization = organization_make(eu_data_routing=True)
    _key, plaintext = api_key_make(organization)
    job = job_make(organization, status=JobStatus.ESTIMATING)
    Job.objects.filter(pk=job.pk).update(data_residency="eu")
    response = client_for(plaintext).post(f"{JOBS}/{job.pk}/cancel")
    assert response.json()["status"] == "cancelled"


def test_cancelling_an_approved_job_before_it_runs_releases_its_hold(
        api: APIClient, organization: Organization) -> None:
    job = job_make(organization, est_cost_cents=100)
    api.post(f"{JOBS}/{job.pk}/approve")
    assert credits_summary(organization=organization).held == 100
    assert api.post(f"{JOBS}/{job.pk}/cancel").json()["status"] == "cancelled"
    assert credits_summary(organization=organization).held == 0
    assert AuditEvent.objects.get(action="job.cancelled").data == {"from": "in_progress",
                                                                   "to": "cancelled"}


@pytest.mark.parametrize("path", ["", "/approve", "/cancel"])
def test_another_organizations_job_is_404_everywhere(api: APIClient, path: str) -> None:
    theirs = job_make(organization_make())
    method = api.get if not path else api.post
    response = method(f"{JOBS}/{theirs.pk}{path}")
    assert (response.status_code, response.json()) == (404, {"detail": "Job not found"})


def test_estimates_left_unapproved_for_24_hours_cancel_free(organization: Organization) -> None:
    stale = job_make(organization)
    fresh = job_make(organization)
    Job.objects.filter(pk=stale.pk).update(cost_ready_at=timezone.now() - timedelta(hours=25))
    Job.objects.filter(pk=fresh.pk).update(cost_ready_at=timezone.now() - timedelta(hours=23))
    before = credits_summary(organization=organization)
    assert lease_recover(APPROVAL, timezone.now()) == 1
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert (stale.status, fresh.status) == (JobStatus.CANCELLED, JobStatus.COST_READY)
    assert stale.failure_reason == "The estimate was not approved within 24 hours."
    assert credits_summary(organization=organization) == before


def test_auto_approve_approves_as_if_called(organization: Organization) -> None:
    job = job_make(organization, est_cost_cents=10)
    job_auto_approve(job=job)
    job.refresh_from_db()
    assert job.status == JobStatus.IN_PROGRESS
    assert AuditEvent.objects.get(action="job.approved").actor_label == "system: auto-approve"


def test_auto_approve_that_is_not_covered_leaves_the_estimate(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make(auto_approve=True)
    credits_grant(organization=organization, cents=5, reason="t", actor=SYSTEM)
    job = job_make(organization, est_cost_cents=10)
    job_auto_approve(job=job)
    job.refresh_from_db()
    assert job.status == JobStatus.COST_READY


# --- the one writer of Job.status (issue 10) ---------------------------------------------


def _job_in(organization: Organization, status: JobStatus) -> Job:
    """A job in `status`; past approval it holds its estimate, as a real one does."""
    job = job_make(organization, est_cost_cents=50)
    if status in (JobStatus.IN_PROGRESS, JobStatus.CANCELLING, JobStatus.FINALIZING):
        job = job_approve(job=job, actor=SYSTEM)
    Job.objects.filter(pk=job.pk).update(status=status, data_delete_requested=True)
    return Job.objects.get(pk=job.pk)


MOVES = [(src, to) for src, targets in JOB_TRANSITIONS.items() for to in sorted(targets)]


@pytest.mark.parametrize("src,to", MOVES, ids=[f"{s}->{t}" for s, t in MOVES])
def test_every_allowed_transition_writes_its_event_and_its_states_effects(
        organization: Organization, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Any, src: JobStatus, to: JobStatus) -> None:
    hooks: list[tuple[str, str]] = []
    monkeypatch.setattr("jobs.services.webhooks.job_webhook_enqueue",
                        lambda *, job, status: hooks.append((status, job.status)))
    balance = credits_summary(organization=organization).balance
    job = _job_in(organization, src)
    events = JobEvent.objects.filter(job=job).count()  # an approval, for a job past it
    hooks.clear()
    cost = 20 if to == JobStatus.DONE else 0
    with django_capture_on_commit_callbacks(execute=True):
        moved = job_transition(job=job, to=to, actor=SYSTEM, cost_cents=cost)
    assert moved is not None and moved.status == to
    moved.refresh_from_db()
    assert JobEvent.objects.filter(job=job).count() == events + 1
    event = JobEvent.objects.filter(job=job).last()
    assert event is not None
    assert (event.from_status, event.to_status, event.actor_label) == (src, to, "system: tests")
    assert hooks == [(to, to)]  # the webhook sees the job as it now is
    credits = credits_summary(organization=organization)
    if to in TERMINAL_STATUSES:
        assert moved.finished_at is not None and moved.data_expires_at == \
            moved.finished_at + timedelta(days=30)
        assert moved.data_deleted_at is not None  # deletion was requested: purged on commit
        assert (credits.held, balance - credits.balance, moved.cost_cents) == (0, cost, cost)
    else:
        assert (moved.data_expires_at, moved.data_deleted_at) == (None, None)
        assert credits.balance == balance
    # A repeat is refused and writes nothing, settles nothing.
    assert job_transition(job=job, to=to, actor=SYSTEM, cost_cents=cost) is None
    assert JobEvent.objects.filter(job=job).count() == events + 1
    assert credits_summary(organization=organization) == credits


@pytest.mark.parametrize("src,to", [(s, t) for s in JobStatus for t in JobStatus
                                    if t not in JOB_TRANSITIONS[s]])
def test_every_other_move_is_refused(organization: Organization, src: JobStatus,
                                     to: JobStatus) -> None:
    job = _job_in(organization, src)
    events = JobEvent.objects.filter(job=job).count()
    assert job_transition(job=job, to=to, actor=SYSTEM) is None
    assert Job.objects.get(pk=job.pk).status == src
    assert JobEvent.objects.filter(job=job).count() == events


def test_job_status_is_written_only_by_job_transition() -> None:
    """Issue 10: status was written in lifecycle, estimation and running. Any write of it
    in the product's code (tests/product.py writers) but job_transition's module fails
    this (tests and benchmarks make their fixtures in a state directly)."""
    assert writers("Job", {"status"}) == {"jobs/services/lifecycle.py"}


def test_a_submitted_job_records_its_creation(api: APIClient, organization: Organization) -> None:
    from tests.db.test_jobs_estimate import embedding_row, jsonl
    from tests.factories import input_ready

    item = input_ready(organization, jsonl(embedding_row("a", "x")))
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "qwen3-embedding-8b"},
                        format="json")
    event = JobEvent.objects.get(job_id=response.json()["id"])
    assert (event.from_status, event.to_status) == ("", "submitted")
    assert event.actor_label.startswith("key ")


@pytest.mark.parametrize("residency", ["world", "eu"])
@pytest.mark.parametrize("status", list(JobStatus))
def test_cancel_and_delete_data_agree_on_what_stops_now(
        api: APIClient, client_for: Any, status: JobStatus, residency: str) -> None:
    """Issue 10: "can this job be cancelled now" was decided twice (lifecycle, data)."""
    organization = organization_make(eu_data_routing=residency == "eu")
    _key, plaintext = api_key_make(organization)
    client = client_for(plaintext)
    by_cancel, by_delete = (job_make(organization, status=status) for _ in range(2))
    Job.objects.filter(pk__in=[by_cancel.pk, by_delete.pk]).update(data_residency=residency)
    cancelled = client.post(f"{JOBS}/{by_cancel.pk}/cancel").status_code == 200 \
        and status != JobStatus.CANCELLING
    client.delete(f"{JOBS}/{by_delete.pk}/data")
    stopped = Job.objects.get(pk=by_delete.pk).status != status
    assert cancelled == stopped == (status in CANCELLABLE[residency])


def test_a_cancelled_or_expired_job_has_its_data_expiry(api: APIClient,
                                                        organization: Organization) -> None:
    """Issue 10: data_expires_at stayed null on failed and cancelled jobs."""
    job = job_make(organization)
    api.post(f"{JOBS}/{job.pk}/cancel")
    assert api.get(f"{JOBS}/{job.pk}").json()["data_expires_at"] is not None
    stale = job_make(organization)
    Job.objects.filter(pk=stale.pk).update(cost_ready_at=timezone.now() - timedelta(hours=25))
    lease_recover(APPROVAL, timezone.now())
    assert api.get(f"{JOBS}/{stale.pk}").json()["data_expires_at"] is not None
