"""GET /jobs/{id}/progress: rows done, total, rate and ETA from the job's chunks, one
aggregate query whatever the job's size; the job object itself keeps its status alone."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from pytest_django import DjangoAssertNumQueries
from rest_framework.test import APIClient

from console.models import Organization
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from tests.factories import job_make, organization_make

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"


def running(organization: Organization, *, rows: int, seconds_ago: float,
            chunks: list[tuple[int, ChunkStatus]], status: JobStatus = JobStatus.IN_PROGRESS,
            finished_after: float | None = None) -> Job:
    """A job approved `seconds_ago`, with these chunks (row count, status)."""
    job = job_make(organization, status=status)
    approved = timezone.now() - timedelta(seconds=seconds_ago)
    Job.objects.filter(pk=job.pk).update(
        row_count=rows, approved_at=approved,
        finished_at=None if finished_after is None else approved + timedelta(
            seconds=finished_after))
    first = 0
    for index, (count, state) in enumerate(chunks):
        Chunk.objects.create(job=job, index=index, first_row=first, row_count=count,
                             status=state)
        first += count
    return job


def progress(api: APIClient, job: Job) -> dict[str, object]:
    response = api.get(f"{JOBS}/{job.pk}/progress")
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def test_a_running_job_reports_rows_done_its_rate_and_eta(api: APIClient,
                                                          organization: Organization) -> None:
    # given a job approved 100 s ago with two of its three chunks done
    job = running(organization, rows=612, seconds_ago=100, chunks=[
        (256, ChunkStatus.DONE), (256, ChunkStatus.DONE), (100, ChunkStatus.RUNNING)])
    # then 512 rows are done at about 5.12 a second, 100 left: about 20 s to go
    body = progress(api, job)
    assert list(body) == ["done_rows", "total_rows", "eta_seconds", "rows_per_second",
                          "rows_readable_after"]
    assert (body["done_rows"], body["total_rows"]) == (512, 612)
    # and GET /jobs/{id}/rows reads the first two chunks' rows: up to line 512
    assert body["rows_readable_after"] == 512
    assert body["rows_per_second"] == pytest.approx(5.12, rel=0.01)
    assert body["eta_seconds"] in (20, 21)


def test_before_any_chunk_finished_rate_and_eta_are_unknown(
        api: APIClient, organization: Organization) -> None:
    job = running(organization, rows=300, seconds_ago=5, chunks=[
        (256, ChunkStatus.RUNNING), (44, ChunkStatus.PENDING)])
    assert progress(api, job) == {"done_rows": 0, "total_rows": 300, "eta_seconds": None,
                                  "rows_per_second": None, "rows_readable_after": 0}


def test_a_job_not_yet_approved_has_done_nothing(api: APIClient,
                                                 organization: Organization) -> None:
    submitted = job_make(organization, status=JobStatus.SUBMITTED)
    assert progress(api, submitted) == {"done_rows": 0, "total_rows": None,
                                        "eta_seconds": None, "rows_per_second": None,
                                        "rows_readable_after": 0}
    ready = job_make(organization, status=JobStatus.COST_READY)
    Job.objects.filter(pk=ready.pk).update(row_count=40)
    assert progress(api, ready)["total_rows"] == 40
    assert progress(api, ready)["eta_seconds"] is None


def test_a_finished_job_reports_every_row_done_at_the_runs_rate(
        api: APIClient, organization: Organization) -> None:
    job = running(organization, rows=300, seconds_ago=600, finished_after=60,
                  status=JobStatus.DONE, chunks=[(256, ChunkStatus.DONE),
                                                 (44, ChunkStatus.DONE)])
    Job.objects.filter(pk=job.pk).update(result_key="results/x/result.jsonl")
    job.refresh_from_db()
    assert progress(api, job) == {"done_rows": 300, "total_rows": 300, "eta_seconds": 0,
                                  "rows_per_second": 5.0, "rows_readable_after": 300}


def test_finalizing_has_no_rows_left(api: APIClient, organization: Organization) -> None:
    job = running(organization, rows=10, seconds_ago=10, status=JobStatus.FINALIZING,
                  chunks=[(10, ChunkStatus.DONE)])
    body = progress(api, job)
    assert (body["done_rows"], body["eta_seconds"]) == (10, 0)


@pytest.mark.parametrize("status", [JobStatus.CANCELLING, JobStatus.CANCELLED,
                                    JobStatus.FAILED])
def test_a_stopped_job_with_rows_that_will_never_run_has_no_eta(
        api: APIClient, organization: Organization, status: JobStatus) -> None:
    job = running(organization, rows=300, seconds_ago=100, status=status,
                  finished_after=None if status == JobStatus.CANCELLING else 50,
                  chunks=[(256, ChunkStatus.DONE), (44, ChunkStatus.SKIPPED)])
    body = progress(api, job)
    assert (body["done_rows"], body["total_rows"], body["eta_seconds"]) == (256, 300, None)


def test_it_is_one_query_however_many_chunks(api: APIClient, organization: Organization,
                                             django_assert_max_num_queries:
                                             DjangoAssertNumQueries) -> None:
    small = running(organization, rows=1, seconds_ago=5, chunks=[(1, ChunkStatus.DONE)])
    large = running(organization, rows=256 * 200, seconds_ago=5,
                    chunks=[(256, ChunkStatus.DONE)] * 200)
    with django_assert_max_num_queries(8) as small_queries:
        progress(api, small)
    with django_assert_max_num_queries(len(small_queries)):
        assert progress(api, large)["done_rows"] == 256 * 200


def test_the_job_object_keeps_its_status_alone(api: APIClient,
                                               organization: Organization) -> None:
    # The reference: "a job in progress reports its status alone".
    job = running(organization, rows=300, seconds_ago=100,
                  chunks=[(256, ChunkStatus.DONE), (44, ChunkStatus.RUNNING)])
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert body["success_rows"] is None and body["pending_rows"] is None
    assert not {"done_rows", "total_rows", "eta_seconds", "rows_per_second"} & set(body)


def test_another_organizations_job_is_404(api: APIClient) -> None:
    theirs = running(organization_make(), rows=1, seconds_ago=1,
                     chunks=[(1, ChunkStatus.DONE)])
    for job_id in (theirs.pk, "not-a-uuid"):
        response = api.get(f"{JOBS}/{job_id}/progress")
        assert (response.status_code, response.json()) == (404, {"detail": "Job not found"})


def test_it_needs_a_key(organization: Organization) -> None:
    job = job_make(organization)
    assert APIClient().get(f"{JOBS}/{job.pk}/progress").status_code == 422


def test_the_openapi_document_describes_progress_and_the_key_header() -> None:
    document = APIClient().get("/openapi.json").json()
    operation = document["paths"]["/batch/v1/jobs/{job_id}/progress"]["get"]
    assert operation["operationId"] == "getJobProgress"
    schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["required"] == ["done_rows", "total_rows", "eta_seconds", "rows_per_second",
                                  "rows_readable_after"]
    keyed = {(path, method) for path, item in document["paths"].items()
             for method, op in item.items() if isinstance(op, dict) and any(
                 p.get("name") == "Idempotency-Key" and p.get("in") == "header"
                 for p in op.get("parameters", []))}
    assert {("/batch/v1/inputs", "post"), ("/batch/v1/jobs", "post"),
            ("/batch/v1/jobs/{job_id}/approve", "post"),
            ("/batch/v1/jobs/{job_id}/cancel", "post")} <= keyed
