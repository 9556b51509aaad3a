"""The recovery pass (jobs.services.recovery): every lease, its cap, and what happens past
it - the regressions of issue 10's "What is wrong today"."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.services import credits_summary
from console.models import Organization
from inference.constants import RowOutcome
from jobs.constants import (
    AWAITING_APPROVAL_STATUSES,
    TERMINAL_STATUSES,
    ChunkStatus,
    InputStatus,
    JobStatus,
    JobSubstate,
)
from jobs.models import Chunk, Input, Job, WebhookDelivery
from jobs.services.estimation import job_estimate
from jobs.services.inputs import INGEST_ATTEMPTS
from jobs.services.lifecycle import job_approve
from jobs.services.recovery import (
    CHUNK,
    ESTIMATE,
    INGEST_COPY,
    LEASES,
    SAMPLE,
    START,
    Lease,
    lease_recover,
)
from jobs.services.running import CHUNK_ATTEMPTS, job_start
from jobs.services.sampling import job_sample
from jobs.storage import storage_for
from jobs.tasks import job_sample_task
from tests.db.test_running import chat_line, complete
from tests.dispatched import dispatch_catch, finalizes_run
from tests.factories import SYSTEM, input_ready, job_make

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
LONG_AGO = timedelta(days=2)


@pytest.fixture(autouse=True)
def funded(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 1000
    settings.ANEX_CHUNK_ROWS = 2


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the recovery pass sends (no worker consumes it here)."""
    calls: list[str] = []
    dispatch_catch(monkeypatch, lambda message: calls.append(message.id), "job_estimate_task",
                   "job_sample_task", "job_start_task", "chunk_run_task", "input_copy_task")
    return calls


def lease_out(lease: Lease) -> int:
    """Run one row of the table as if its lease ran out long ago."""
    return lease_recover(lease, timezone.now() + LONG_AGO)


def sampling_job(organization: Organization) -> Job:
    """A chat job checked and counted, waiting for its sampled estimate."""
    item = input_ready(organization, chat_line("a"))
    job = job_make(organization, status=JobStatus.ESTIMATING, est_cost_cents=None,
                   model="gemma4-12b")
    Job.objects.filter(pk=job.pk).update(input=item, row_count=1, est_input_tok=5,
                                         task_type="chat", substate=JobSubstate.SAMPLING)
    return Job.objects.get(pk=job.pk)


def awaiting(organization: Organization) -> int:
    return Job.objects.for_org(organization).filter(
        status__in=AWAITING_APPROVAL_STATUSES).count()


def test_a_lost_sample_is_sent_again_then_fails_and_frees_its_approval_slot(
        api: APIClient, organization: Organization, sent: list[str]) -> None:
    job = sampling_job(organization)
    assert awaiting(organization) == 1
    for attempt in range(1, SAMPLE.attempts + 1):  # type: ignore[operator]
        assert lease_out(SAMPLE) == 1
        assert Job.objects.get(pk=job.pk).attempts == attempt
    assert sent == [str(job.pk)] * 3
    lease_out(SAMPLE)
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert (body["status"], body["failure_code"]) == ("failed", "internal_error")
    assert body["failure_reason"].startswith("We could not measure this job's output length")
    assert body["data_expires_at"] is not None
    assert awaiting(organization) == 0


def test_a_sample_that_crashes_is_retried_then_fails(organization: Organization,
                                                     sent: list[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def engine_down(*args: Any) -> None:
        raise RuntimeError("the engine did not start")

    monkeypatch.setattr("jobs.services.sampling.sample_generate", engine_down)
    job = sampling_job(organization)
    # The actor, not the service, hands claimed work that crashed out again (jobs.tasks).
    for _ in range(SAMPLE.attempts):  # type: ignore[arg-type]
        assert job_sample_task(str(job.pk)) is None
    assert len(sent) == SAMPLE.attempts
    job_sample_task(str(job.pk))
    job.refresh_from_db()
    assert (job.status, job.failure_code) == (JobStatus.FAILED, "internal_error")


def test_a_duplicate_sample_message_is_not_run_twice(organization: Organization,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[int] = []

    def counted(*args: Any) -> None:
        runs.append(1)
        raise RuntimeError("stop here")

    monkeypatch.setattr("jobs.services.sampling.sample_generate", counted)
    monkeypatch.setattr("jobs.services.recovery.lease_retry", lambda *a: None)
    job = sampling_job(organization)
    Job.objects.filter(pk=job.pk).update(claimed=True)  # a worker is on it
    assert job_sample(job_id=job.pk) is None
    assert runs == []


def test_data_deleted_while_estimating_is_purged_when_the_estimate_gives_up(
        api: APIClient, organization: Organization, sent: list[str],
        django_capture_on_commit_callbacks: Any) -> None:
    item = input_ready(organization, chat_line("a"))
    job = job_make(organization, status=JobStatus.ESTIMATING)
    Job.objects.filter(pk=job.pk).update(input=item, attempts=ESTIMATE.attempts,
                                         claimed=True)
    assert api.delete(f"{JOBS}/{job.pk}/data").status_code == 202
    with django_capture_on_commit_callbacks(execute=True):
        lease_out(ESTIMATE)
    job.refresh_from_db()
    assert (job.status, job.failure_code) == (JobStatus.FAILED, "internal_error")
    assert job.data_deleted_at is not None
    assert not storage_for("world").exists(item.object_key)


def test_data_deleted_while_estimating_is_purged_when_the_model_cannot_be_priced(
        api: APIClient, organization: Organization, settings: Settings,
        django_capture_on_commit_callbacks: Any) -> None:
    settings.ANEX_CHECKPOINTS = {}
    item = input_ready(organization, json.dumps({
        "custom_id": "a", "method": "POST", "url": "/v1/embeddings",
        "body": {"input": "x"}}).encode() + b"\n")
    job = job_make(organization, status=JobStatus.SUBMITTED)
    Job.objects.filter(pk=job.pk).update(input=item, task_type="embed")
    assert api.delete(f"{JOBS}/{job.pk}/data").status_code == 202
    with django_capture_on_commit_callbacks(execute=True):
        assert job_estimate(job_id=job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert job.data_deleted_at is not None and job.data_expires_at is not None


def test_a_lost_start_is_sent_again_then_fails_with_the_hold_released(
        organization: Organization, sent: list[str]) -> None:
    job = job_approve(job=job_make(organization, est_cost_cents=100), actor=SYSTEM)
    assert credits_summary(organization=organization).held == 100
    for _ in range(START.attempts):  # type: ignore[arg-type]
        lease_out(START)
    assert sent == [str(job.pk)] * 3
    lease_out(START)
    job.refresh_from_db()
    assert (job.status, job.failure_code, job.cost_cents) == (JobStatus.FAILED,
                                                             "internal_error", 0)
    assert credits_summary(organization=organization).held == 0


def test_a_chunk_revived_by_the_reaper_checks_its_attempts(
        organization: Organization, sent: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    item = input_ready(organization, b"".join(chat_line(f"r{i}") for i in range(4)))
    job = job_make(organization, est_cost_cents=100, model="gemma4-12b")
    Job.objects.filter(pk=job.pk).update(input=item, row_count=4, max_output_tokens=50)
    job = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    job_start(job_id=job.pk)
    finished, dying = list(job.chunks.order_by("index"))
    complete(finished, [RowOutcome.SUCCESS] * 2)
    Chunk.objects.filter(pk=dying.pk).update(status=ChunkStatus.RUNNING,
                                             attempts=CHUNK_ATTEMPTS,
                                             heartbeat_at=timezone.now())
    with finalizes_run(monkeypatch):  # the finalize the reaped chunk's settle sends
        assert lease_out(CHUNK) == 1
    assert Chunk.objects.get(pk=dying.pk).status == ChunkStatus.FAILED
    job.refresh_from_db()
    assert (job.status, job.partial, job.success_rows) == (JobStatus.FAILED, True, 2)
    assert credits_summary(organization=organization).held == 0
    assert job.cost_cents == 10  # the rows that ran, gemma4-12b's minimum job


def test_an_ingest_copy_stops_past_its_attempt_cap(organization: Organization,
                                                   sent: list[str]) -> None:
    item = Input.objects.create(
        organization=organization, status=InputStatus.COPYING, format="jsonl",
        data_residency="world", object_key="inputs/x.jsonl", input_s3_uri="s3://b/x.jsonl",
        source_url="https://example.com/x.jsonl?X-Amz-Signature=secret",
        callback_url="https://example.com/hook", copy_started_at=timezone.now(),
        attempts=INGEST_ATTEMPTS - 1)
    assert lease_out(INGEST_COPY) == 1  # revived once more
    assert Input.objects.get(pk=item.pk).status == InputStatus.PENDING
    Input.objects.filter(pk=item.pk).update(status=InputStatus.COPYING,
                                            attempts=INGEST_ATTEMPTS)
    lease_out(INGEST_COPY)
    item.refresh_from_db()
    assert (item.status, item.source_url) == (InputStatus.FAILED, "")
    assert item.error.startswith("The copy was interrupted 3 times")
    assert WebhookDelivery.objects.filter(input=item).count() == 1


@pytest.mark.parametrize("status", [JobStatus.SUBMITTED, JobStatus.ESTIMATING,
                                    JobStatus.COST_READY, JobStatus.IN_PROGRESS,
                                    JobStatus.FINALIZING])
def test_no_job_waits_forever(organization: Organization, sent: list[str],
                              status: JobStatus) -> None:
    """Every non-terminal state is in the table: a job whose work is lost ends, freeing
    its approval slot and its hold, after at most its attempts."""
    job = job_make(organization, est_cost_cents=100)
    if status in (JobStatus.IN_PROGRESS, JobStatus.FINALIZING):
        job = job_approve(job=job, actor=SYSTEM)
    Job.objects.filter(pk=job.pk).update(status=status, cost_ready_at=timezone.now())
    for _ in range(20):
        for lease in LEASES:
            lease_recover(lease, timezone.now() + LONG_AGO)
    job.refresh_from_db()
    # (a finalize re-run on a job with no rows simply completes it)
    assert job.status in TERMINAL_STATUSES
    assert job.data_expires_at is not None
    assert credits_summary(organization=organization).held == 0
