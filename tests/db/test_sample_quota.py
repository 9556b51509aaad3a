"""Issue 11, item 5: sampled estimates are free work on the paid models' workers, so an
organization's sampled tokens are capped per hour; samples queue apart from paid chunks
(and, since issue 21, run ahead of them); a sample that crashes fails its job
(tests/db/test_jobs_recovery.py)."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.services import credits_summary
from console.models import Organization
from jobs.constants import JobStatus
from jobs.dispatch import run_queues_declare
from jobs.models import Job
from jobs.services.estimation import job_estimate
from jobs.services.sampling import SAMPLE_ROWS, SampleResult, job_sample, sample_allowance
from jobs.tasks import chunk_run_task, job_sample_task
from tests.dispatched import dispatch_catch
from tests.factories import input_ready

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
ALLOWANCE = 100_000
USED = 40_000  # what each sample below uses


@pytest.fixture(autouse=True)
def setup(settings: Settings, checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 1000
    settings.ANEX_SAMPLE_TOKENS_PER_HOUR = ALLOWANCE
    monkeypatch.setattr(
        "jobs.services.sampling.sample_generate",
        lambda job, model: SampleResult(max_output_tokens=20, reasoning_budget=None,
                                        tokens_per_second=1_000.0, tokens_used=USED))


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The queues messages were sent to (no worker consumes them here)."""
    names: list[str] = []
    dispatch_catch(monkeypatch, lambda message: names.append(message.queue), "job_sample_task",
                   "chunk_run_task")
    return names


def rows(count: int = 3) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "Say hello."}]}}).encode() + b"\n"
        for i in range(count))


def submit(api: APIClient, organization: Organization) -> tuple[int, dict[str, object], Job | None]:
    """A job with no max_output_tokens: priced from a sample."""
    item = input_ready(organization, rows())
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b"},
                        format="json")
    job = Job.objects.get(pk=response.json()["id"]) if response.status_code == 200 else None
    return response.status_code, {**response.json(), "retry": response.get("Retry-After")}, job


def test_a_submit_cancel_loop_is_refused_past_the_hourly_allowance(
        api: APIClient, organization: Organization, queued: list[str]) -> None:
    before = credits_summary(organization=organization)
    # when: the attack - submit, let the free sample run, cancel the estimate, again
    for _ in range(3):
        status, _body, job = submit(api, organization)
        assert status == 200 and job is not None
        assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
        assert job_sample(job_id=job.pk) == JobStatus.COST_READY
        assert api.post(f"{JOBS}/{job.pk}/cancel").json()["status"] == "cancelled"
    # then: 120,000 sampled tokens used of 100,000; the next submit is refused, clearly
    assert sample_allowance(organization_id=organization.pk).used == 3 * USED
    jobs = Job.objects.for_org(organization).count()
    status, body, _ = submit(api, organization)
    assert status == 429
    assert body["detail"] == (
        "This organization has used its hourly allowance of sampled estimates: 120,000 of "
        "100,000 sampled tokens in the last hour. A job that omits max_output_tokens (or, on "
        "a reasoning model, reasoning_budget) is priced from a sample; set them to price it "
        "without one, or submit it again in 60 minutes.")
    assert body["retry"] is not None and 3500 < int(str(body["retry"])) <= 3600
    assert Job.objects.for_org(organization).count() == jobs  # nothing created
    # The run queue saw nothing: the samples went to their own queue, three of them.
    assert queued == ["sample.world.gemma4-12b"] * 3
    # Samples stay free: nothing was held or charged.
    assert credits_summary(organization=organization) == before
    # A job with its cap given needs no sample and is still accepted.
    item = input_ready(organization, rows())
    assert api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b",
                           "max_output_tokens": 50}, format="json").status_code == 200
    # An hour on, the allowance is back.
    Job.objects.for_org(organization).update(
        sampled_at=timezone.now() - timedelta(hours=1, seconds=1))
    assert submit(api, organization)[0] == 200


def test_jobs_queued_before_the_allowance_ran_out_fail_unbilled_without_a_sample(
        api: APIClient, organization: Organization, queued: list[str],
        settings: Settings) -> None:
    # given: ten jobs submitted at once, within the approval queue's cap
    settings.ANEX_SAMPLE_TOKENS_PER_HOUR = 2 * USED
    waiting = [submit(api, organization)[2] for _ in range(10)]
    before = credits_summary(organization=organization)
    # when: their estimates run
    outcomes = [job_estimate(job_id=job.pk) for job in waiting if job is not None]
    # then: each queued sample reserves its worst case (3 rows at up to 32,768 tokens), so
    # the first takes the whole allowance and the rest fail with the reason, unqueued
    assert outcomes == [JobStatus.ESTIMATING] + [JobStatus.FAILED] * 9
    assert queued == ["sample.world.gemma4-12b"]
    failed = Job.objects.get(pk=waiting[1].pk)  # type: ignore[union-attr]
    assert failed.failure_code == "invalid_input"
    assert failed.failure_reason.startswith(
        "This organization has used its hourly allowance of sampled estimates: 98,")
    assert failed.sample_tokens is None and failed.est_cost_cents is None
    first = Job.objects.get(pk=waiting[0].pk)  # type: ignore[union-attr]
    assert first.sample_tokens == 3 * (32_768)
    # The sample runs and its real use replaces the reservation.
    assert job_sample(job_id=first.pk) == JobStatus.COST_READY
    assert sample_allowance(organization_id=organization.pk).used == USED
    assert credits_summary(organization=organization) == before


def test_a_samples_reservation_is_bounded_by_the_sample_and_the_context(
        api: APIClient, organization: Organization, queued: list[str]) -> None:
    from inference.catalog import model_get
    from jobs.services.sampling import sample_reservation

    model = model_get("qwen3.8-27b")
    assert model is not None
    job = Job(organization=organization, model=model.id)
    # 10,000 rows: only the 64 sampled count; each at most the model's largest context.
    assert sample_reservation(job=job, model=model, rows=10_000,
                              input_tokens=10_000 * 500) == SAMPLE_ROWS * (500 + 32_768)
    assert sample_reservation(job=job, model=model, rows=1,
                              input_tokens=120_000) == 131_072


def test_samples_queue_apart_from_chunks_and_ahead_of_them(settings: Settings) -> None:
    settings.ANEX_WORKER_REGIONS = ["world"]
    settings.ANEX_WORKER_MODELS = ["tiny-qwen3"]
    # A worker serving a model consumes its samples beside its chunks ...
    assert run_queues_declare() == ["run.world.tiny-qwen3", "run.world.tiny-qwen3.flex",
                                    "sample.world.tiny-qwen3"]
    # ... and of the messages it holds, takes samples first (a lower number runs first;
    # issue 21: a sample never waits behind paid chunks, tests/db/test_fleet_samples.py).
    assert job_sample_task.priority < chunk_run_task.priority
