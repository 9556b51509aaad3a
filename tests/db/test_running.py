"""The run pipeline around the engines: chunk planning, the guarded claims, finalize's
merge, counts and single charge, results and data endpoints, cancel, the reaper.

The engine call itself is exercised on the real engines in tests/e2e/test_run_e2e.py; here the
chunks' results are written as a worker writes them, to pin down everything after it."""

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
from inference.pricing import Usage, usage_from_json, usage_json
from jobs.constants import ChunkStatus, JobStatus
from jobs.dispatch import run_queue
from jobs.models import Chunk, Job
from jobs.results import chunk_key
from jobs.services.lifecycle import job_approve
from jobs.services.purge import results_purge_expired
from jobs.services.recovery import CHUNK, lease_recover
from jobs.services.running import chunks_plan, job_finalize, job_start, job_usage
from jobs.storage import storage_for
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, input_ready, job_make, organization_make

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"


def chat_line(custom_id: str) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": "hi"}]}}).encode() + b"\n"


@pytest.fixture(autouse=True)
def small_chunks(settings: Settings) -> None:
    settings.ANEX_CHUNK_ROWS = 2
    settings.ANEX_FREE_GRANT_CENTS = 1000


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """Messages sent to the run queues (no worker consumes them here)."""
    calls: list[tuple[str, str]] = []
    dispatch_catch(monkeypatch, lambda message: calls.append((message.queue, message.id)),
                   "chunk_run_task")
    return calls


def approved_job(organization: Organization, rows: int = 5, est: int = 100) -> Job:
    content = b"".join(chat_line(f"r{i}") for i in range(rows))
    item = input_ready(organization, content)
    job = job_make(organization, est_cost_cents=est, model="gemma4-12b")
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, max_output_tokens=50)
    return job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)


def complete(chunk: Chunk, outcomes: list[RowOutcome], tokens: int = 10) -> None:
    """Write the chunk's results and mark it done, exactly as chunk_run does."""
    job = chunk.job
    lines = []
    for offset, outcome in enumerate(outcomes):
        index = chunk.first_row + offset
        produced = outcome != RowOutcome.ERROR
        lines.append(json.dumps({
            "i": index, "id": f"r{index}", "outcome": outcome.value,
            "status_code": 200 if produced else 400,
            "body": {"choices": [{"message": {"content": f"a{index}"}}]} if produced else None,
            "error": None if produced else {"message": "too long", "type":
                                            "invalid_request_error", "code": None,
                                            "param": None},
            "output": f"a{index}" if produced else None, "embedding": None}).encode() + b"\n")
    storage_for(job.data_residency).write_stream(chunk_key(job, chunk.index), iter(lines),
                                                 max_bytes=10**6)
    billable = sum(o != RowOutcome.ERROR for o in outcomes)
    Chunk.objects.filter(pk=chunk.pk).update(
        status=ChunkStatus.DONE, finished_at=timezone.now(),
        success_rows=outcomes.count(RowOutcome.SUCCESS),
        error_rows=outcomes.count(RowOutcome.ERROR),
        truncated_rows=outcomes.count(RowOutcome.TRUNCATED),
        format_error_rows=outcomes.count(RowOutcome.FORMAT_ERROR),
        usage=usage_json(Usage(input_tokens=tokens * billable, output_tokens=tokens * billable)))


def test_jsonl_inputs_are_planned_in_byte_ranges(organization: Organization) -> None:
    job = approved_job(organization, rows=5)
    chunks = chunks_plan(job)
    assert [(c.first_row, c.row_count) for c in chunks] == [(0, 2), (2, 2), (4, 1)]
    line = len(chat_line("r0"))
    assert (chunks[0].byte_start, chunks[0].byte_end) == (0, 2 * line)
    assert chunks[2].byte_end == 5 * line


def test_starting_plans_once_and_sends_each_chunk_to_its_models_queue(
        organization: Organization, sent: list[tuple[str, str]]) -> None:
    job = approved_job(organization, rows=5)
    assert job_start(job_id=job.pk) == 3
    assert {queue for queue, _ in sent} == {"run.world.gemma4-12b"}
    assert job_start(job_id=job.pk) == 3  # a repeat plans nothing new
    assert Chunk.objects.filter(job=job).count() == 3
    assert run_queue("eu", "laya") == "run.eu.laya"


def test_finalize_merges_in_order_counts_and_charges_once(organization: Organization,
                                                          api: APIClient,
                                                          sent: list[tuple[str, str]]) -> None:
    job = approved_job(organization, rows=5, est=100)
    job_start(job_id=job.pk)
    chunks = list(job.chunks.order_by("index"))
    complete(chunks[1], [RowOutcome.SUCCESS, RowOutcome.TRUNCATED])
    assert job_finalize(job_id=job.pk) is None  # not every chunk has settled
    complete(chunks[0], [RowOutcome.SUCCESS, RowOutcome.ERROR])
    complete(chunks[2], [RowOutcome.FORMAT_ERROR])
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    assert job_finalize(job_id=job.pk) is None  # settled once
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert body["status"] == "done"
    assert (body["success_rows"], body["error_rows"], body["truncated_rows"],
            body["format_error_rows"], body["pending_rows"]) == (2, 1, 1, 1, 0)
    assert body["partial"] is False and body["data_expires_at"] is not None
    credits = credits_summary(organization=organization)
    assert credits.held == 0
    job.refresh_from_db()
    assert job.cost_cents == 10  # gemma4-12b's minimum job, well under the 100 held
    result = api.get(f"{JOBS}/{job.pk}/result").json()
    assert (result["row_count"], result["partial"], result["expires_in"]) == (5, False, 3600)
    path = storage_for("world").path(job.result_key)  # type: ignore[attr-defined]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["custom_id"] for line in lines] == ["r0", "r1", "r2", "r3", "r4"]
    assert lines[0]["id"] == "batch_req_r0"
    assert lines[0]["response"]["status_code"] == 200 and lines[0]["error"] is None
    assert lines[1]["response"]["body"] is None
    assert lines[1]["error"]["type"] == "invalid_request_error"


def test_cancel_while_rows_run_delivers_a_partial_result(organization: Organization,
                                                         api: APIClient,
                                                         sent: list[tuple[str, str]]) -> None:
    job = approved_job(organization, rows=5)
    job_start(job_id=job.pk)
    first, *rest = list(job.chunks.order_by("index"))
    Chunk.objects.filter(pk=first.pk).update(status=ChunkStatus.RUNNING,
                                             heartbeat_at=timezone.now())
    assert api.post(f"{JOBS}/{job.pk}/cancel").json()["status"] == "cancelling"
    # The pending chunks are skipped when a worker reaches them; the running one finishes.
    from jobs.services.running import chunk_run

    for chunk in rest:
        assert chunk_run(chunk_id=chunk.pk) == ChunkStatus.SKIPPED
    complete(Chunk.objects.get(pk=first.pk), [RowOutcome.SUCCESS, RowOutcome.SUCCESS])
    assert job_finalize(job_id=job.pk) == JobStatus.CANCELLED
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert (body["status"], body["partial"], body["success_rows"], body["pending_rows"]) == (
        "cancelled", True, 2, 3)
    result = api.get(f"{JOBS}/{job.pk}/result").json()
    assert (result["partial"], result["row_count"]) == (True, 2)
    assert credits_summary(organization=organization).held == 0


def test_cancel_with_no_work_in_flight_is_immediate_and_free(organization: Organization,
                                                             api: APIClient,
                                                             sent: list[tuple[str, str]]) -> None:
    job = approved_job(organization, rows=5)
    job_start(job_id=job.pk)
    before = credits_summary(organization=organization)
    assert api.post(f"{JOBS}/{job.pk}/cancel").json()["status"] == "cancelled"
    assert set(job.chunks.values_list("status", flat=True)) == {ChunkStatus.SKIPPED}
    after = credits_summary(organization=organization)
    assert (after.balance, after.held) == (before.balance, 0)
    response = api.get(f"{JOBS}/{job.pk}/result")
    assert response.status_code == 409
    assert response.json()["detail"] == ("This job is cancelled and delivered no rows: there "
                                         "is nothing to download.")


def test_result_states(organization: Organization, api: APIClient) -> None:
    running = job_make(organization, status=JobStatus.IN_PROGRESS)
    response = api.get(f"{JOBS}/{running.pk}/result")
    assert (response.status_code, response.json()["detail"]) == (
        409, "This job is in_progress: its result does not exist yet.")
    gone = job_make(organization, status=JobStatus.DONE)
    Job.objects.filter(pk=gone.pk).update(data_deleted_at=timezone.now(), result_key="x")
    response = api.get(f"{JOBS}/{gone.pk}/result")
    assert response.status_code == 410
    theirs = job_make(organization_make(), status=JobStatus.DONE)
    assert api.get(f"{JOBS}/{theirs.pk}/result").status_code == 404
    assert api.delete(f"{JOBS}/{theirs.pk}/data").status_code == 404


def test_an_eu_result_is_downloaded_from_the_eu_api(client_for) -> None:  # type: ignore[no-untyped-def]
    from tests.factories import api_key_make

    organization = organization_make(eu_data_routing=True)
    _key, plaintext = api_key_make(organization)
    job = job_make(organization, status=JobStatus.DONE)
    Job.objects.filter(pk=job.pk).update(data_residency="eu")
    response = client_for(plaintext).get(f"{JOBS}/{job.pk}/result")
    assert response.status_code == 421
    assert response.json()["api"] == "https://api-eu.anex.sh"


def test_deleting_a_finished_jobs_data_removes_every_object(organization: Organization,
                                                            api: APIClient,
                                                            sent: list[tuple[str, str]]) -> None:
    job = approved_job(organization, rows=2)
    job_start(job_id=job.pk)
    (chunk,) = job.chunks.all()
    complete(chunk, [RowOutcome.SUCCESS, RowOutcome.SUCCESS])
    job_finalize(job_id=job.pk)
    job.refresh_from_db()
    storage = storage_for("world")
    keys = [job.result_key, chunk_key(job, 0), job.input.object_key]  # type: ignore[union-attr]
    assert all(storage.exists(key) for key in keys)
    first = api.delete(f"{JOBS}/{job.pk}/data")
    assert first.status_code == 200
    assert first.json()["status"] == "done" and first.json()["data_deleted_at"]
    assert not any(storage.exists(key) for key in keys)
    again = api.delete(f"{JOBS}/{job.pk}/data")
    assert (again.status_code, again.json()["data_deleted_at"]) == (
        200, first.json()["data_deleted_at"])
    assert api.get(f"{JOBS}/{job.pk}/result").status_code == 410
    polled = api.get(f"{JOBS}/{job.pk}").json()
    assert polled["data_deleted_at"] == first.json()["data_deleted_at"]
    assert polled["success_rows"] == 2  # the record stays


def test_deleting_a_running_jobs_data_cancels_it_first(
        organization: Organization, api: APIClient, sent: list[tuple[str, str]],
        django_capture_on_commit_callbacks: Any) -> None:
    job = approved_job(organization, rows=4)
    job_start(job_id=job.pk)
    first, second = list(job.chunks.order_by("index"))
    Chunk.objects.filter(pk=first.pk).update(status=ChunkStatus.RUNNING,
                                             heartbeat_at=timezone.now())
    response = api.delete(f"{JOBS}/{job.pk}/data")
    assert response.status_code == 202
    assert response.json() == {
        "id": str(job.pk), "status": "cancelling", "data_deleted_at": None,
        "message": "the job is being cancelled; its input and any result will be deleted "
                   "once it stops"}
    assert api.delete(f"{JOBS}/{job.pk}/data").status_code == 202
    from jobs.services.running import chunk_run

    chunk_run(chunk_id=second.pk)
    complete(Chunk.objects.get(pk=first.pk), [RowOutcome.SUCCESS, RowOutcome.SUCCESS])
    with django_capture_on_commit_callbacks(execute=True):  # the purge follows the commit
        job_finalize(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.data_deleted_at is not None
    assert not storage_for("world").exists(job.result_key)
    assert api.get(f"{JOBS}/{job.pk}/result").status_code == 410


def test_results_are_purged_30_days_after_the_job_ends(organization: Organization,
                                                       sent: list[tuple[str, str]]) -> None:
    job = approved_job(organization, rows=2)
    job_start(job_id=job.pk)
    complete(job.chunks.get(), [RowOutcome.SUCCESS, RowOutcome.SUCCESS])
    job_finalize(job_id=job.pk)
    assert results_purge_expired() == 0
    Job.objects.filter(pk=job.pk).update(data_expires_at=timezone.now() - timedelta(seconds=1))
    assert results_purge_expired() == 1
    job.refresh_from_db()
    assert job.data_deleted_at is not None
    assert not storage_for("world").exists(job.result_key)


def test_the_reaper_requeues_the_chunks_of_dead_workers(organization: Organization,
                                                        sent: list[tuple[str, str]]) -> None:
    job = approved_job(organization, rows=4)
    job_start(job_id=job.pk)
    sent.clear()
    dead, alive = list(job.chunks.order_by("index"))
    long_ago = timezone.now() - timedelta(minutes=10)
    Chunk.objects.filter(pk=dead.pk).update(status=ChunkStatus.RUNNING, heartbeat_at=long_ago)
    Chunk.objects.filter(pk=alive.pk).update(status=ChunkStatus.RUNNING,
                                             heartbeat_at=timezone.now())
    assert lease_recover(CHUNK, timezone.now()) == 1
    assert sent == [("run.world.gemma4-12b", str(dead.pk))]
    assert Chunk.objects.get(pk=dead.pk).status == ChunkStatus.PENDING




def test_chunk_usage_round_trips_and_old_media_row_keys_still_settle(
        organization: Organization) -> None:
    from decimal import Decimal

    from inference.pricing import Usage

    usage = Usage(input_tokens=5, media_row_tokens=7, images=2, media_seconds=Decimal("1.5"))
    assert usage_from_json(usage_json(usage)) == usage
    # a chunk stored before media rows were billed at one rate (images and video apart)
    stored = {"input_tokens": 5, "image_row_tokens": 3, "video_row_tokens": 4, "images": 2,
              "media_seconds": "1.5"}
    assert usage_from_json(stored) == usage
    # and the job's settled usage, summed in the database, reads both layouts alike
    job = approved_job(organization, rows=4)
    Chunk.objects.bulk_create(chunks_plan(job))
    first, second = job.chunks.order_by("index")[:2]
    Chunk.objects.filter(pk=first.pk).update(status=ChunkStatus.DONE, usage=stored)
    Chunk.objects.filter(pk=second.pk).update(status=ChunkStatus.DONE, usage=usage_json(usage))
    assert job_usage(job) == usage + usage
