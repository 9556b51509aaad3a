"""The admin's operations page and its read-only job, chunk and input pages (issue 24 item
4): staff who may view jobs see queue depths read from the real Redis broker, the workers'
heartbeats (written by a real Dramatiq worker), running jobs with the one ETA rule, the
oldest waiting chunk and recent failures by class; nothing there writes, and an input's
secrets are never shown."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
from django.test import Client
from django.utils import timezone

from jobs import dispatch
from jobs.constants import ChunkStatus, FailureCode, JobStatus
from jobs.failures import FailureClass, failure_note, failures_by_class
from jobs.models import Chunk, Input, Job, JobEvent, WorkerHeartbeat
from jobs.selectors import job_progress_of, queue_depths
from jobs.services.running import chunk_run, job_start
from jobs.services.workers import worker_beat, worker_name
from tests.db.test_admin_permissions import staff_with
from tests.db.test_fair_dispatch import MODEL, approved_job, finish
from tests.dispatched import dispatch_catch
from tests.factories import job_make, organization_make
from tests.workers import broker_flush, running_worker, until

OPERATIONS = "/admin/operations/"


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, settings: Any) -> list[str]:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_DISPATCH_IN_FLIGHT = settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 2
    ids: list[str] = []
    dispatch_catch(monkeypatch, lambda message: ids.append(message.id), "chunk_run_task")
    return ids


@pytest.mark.django_db
def test_only_staff_who_may_view_jobs_open_the_operations_page() -> None:
    assert Client().get(OPERATIONS).status_code == 302  # to the sign-in
    assert staff_with().get(OPERATIONS).status_code == 403
    assert staff_with("view_organization").get(OPERATIONS).status_code == 403
    page = staff_with("view_job").get(OPERATIONS)
    assert page.status_code == 200
    assert 'href="/admin/operations/"' in staff_with("view_job").get("/admin/").content.decode()
    assert 'href="/admin/operations/"' not in staff_with(
        "view_organization").get("/admin/").content.decode()


@pytest.mark.django_db
def test_the_page_shows_queues_workers_running_jobs_the_oldest_chunk_and_failures(
        sent: list[str]) -> None:
    broker = dramatiq.get_broker()
    broker.declare_queue(dispatch.ESTIMATE)  # flush_all empties the declared queues
    broker.flush_all()
    # Three estimates waiting in their queue, one delayed; read from Redis as they are.
    for _ in range(3):
        dispatch.send("job_estimate_task", str(uuid.uuid4()))
    dispatch.send("job_estimate_task", str(uuid.uuid4()), delay_ms=600_000)
    depths = {depth.name: depth for depth in queue_depths() or []}
    assert (depths["estimate"].ready, depths["estimate"].delayed) == (3, 1)
    assert dispatch.run_queue("world", MODEL) in depths
    # A live worker and one that went silent.
    worker_beat(name="gpu-7:101", queues=[dispatch.run_queue("world", MODEL)])
    worker_beat(name="gpu-8:102", queues=[])
    WorkerHeartbeat.objects.filter(name="gpu-8:102").update(
        beat_at=timezone.now() - timedelta(minutes=10))
    # A running job, one chunk done of four, two more waiting their turn.
    job = approved_job(organization_make(name="Acme Research"), rows=4)
    job_start(job_id=job.pk)
    finish(sent[0])
    # Approved 100 s ago: the page reads the rate a moment after this test does.
    Job.objects.filter(pk=job.pk).update(approved_at=timezone.now() - timedelta(seconds=100))
    before = failures_by_class() or {}
    failure_note(FailureClass.ENGINE)
    failure_note(FailureClass.ENGINE)
    failed = job_make(status=JobStatus.FAILED)
    Job.objects.filter(pk=failed.pk).update(failure_code=FailureCode.INVALID_INPUT,
                                            finished_at=timezone.now())

    page = staff_with("view_job").get(OPERATIONS)
    assert page.status_code == 200
    html = page.content.decode()
    context = page.context
    queues = {queue.name: queue for queue in context["queues"]}
    assert queues["estimate"].ready == 3 and queues["estimate"].delayed == 1
    # The run queue a live worker consumes is listed; an idle, unconsumed one is not.
    assert dispatch.run_queue("world", MODEL) in queues
    assert dispatch.run_queue("eu", MODEL) not in queues
    states = {worker["seen"].heartbeat.name: worker["seen"].alive
              for worker in context["workers"]}
    assert states["gpu-7:101"] is True and states["gpu-8:102"] is False
    assert "silent" in html and "alive" in html
    (group,) = [g for g in context["running"] if g["model"].model == MODEL]
    progress = job_progress_of(job=Job.objects.get(pk=job.pk))
    assert (group["model"].done_rows, group["model"].total_rows) == (1, 4)
    assert group["model"].rows_per_second == pytest.approx(progress.rows_per_second, rel=0.1)
    assert progress.eta_seconds is not None
    assert group["model"].eta_seconds == pytest.approx(progress.eta_seconds, rel=0.1)
    assert "Acme Research" in html and str(job.pk) in html
    oldest = context["oldest"]["waiting"]
    assert oldest.chunk.job_id == job.pk and oldest.chunk.status == ChunkStatus.PENDING
    failures = {name: count for name, count, _means in context["chunk_failures"]}
    assert failures[FailureClass.ENGINE] == before.get(FailureClass.ENGINE, 0) + 2
    assert dict(context["jobs_failed"])[FailureCode.INVALID_INPUT] >= 1


@pytest.mark.django_db
def test_a_chunk_failure_is_counted_by_its_class(sent: list[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def storage_down(job: Job, rows: Any) -> Any:
        raise ConnectionError("storage did not answer")

    monkeypatch.setattr("jobs.services.running.execute", storage_down)
    job = approved_job(organization_make(), rows=1)
    job_start(job_id=job.pk)
    before = failures_by_class() or {}
    assert chunk_run(chunk_id=sent[0]) == ChunkStatus.PENDING  # waited out
    after = failures_by_class() or {}
    assert after[FailureClass.INFRASTRUCTURE] == before.get(FailureClass.INFRASTRUCTURE, 0) + 1
    assert after[FailureClass.UNEXPECTED] == before.get(FailureClass.UNEXPECTED, 0)


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_beats_and_its_row_goes_when_it_stops(settings: Any) -> None:
    settings.ANEX_WORKER_MODELS = [MODEL]
    settings.ANEX_WORKER_REGIONS = ["eu"]
    name = worker_name()
    broker_flush()
    dispatch.run_queues_declare()
    with running_worker():
        until(lambda: WorkerHeartbeat.objects.filter(name=name).exists(), timeout=60)
        beat = WorkerHeartbeat.objects.get(name=name)
        assert (beat.served_models, beat.regions) == ([MODEL], ["eu"])
        assert dispatch.run_queue("eu", MODEL) in beat.queues
        assert beat.engines_loaded == []  # nothing has loaded an engine in this process
    assert not WorkerHeartbeat.objects.filter(name=name).exists()


@pytest.mark.django_db
def test_job_chunk_and_input_pages_are_read_only_and_show_no_secret(sent: list[str]) -> None:
    job = approved_job(organization_make(), rows=2)
    job_start(job_id=job.pk)
    Input.objects.filter(jobs=job).update(
        source_url="https://bucket.example/in.jsonl?X-Amz-Signature=SECRETSIG",
        callback_secret_encrypted="ENCRYPTEDSECRET")
    Job.objects.filter(pk=job.pk).update(input_errors=[{"message": "row text QUOTED"}])
    staff = staff_with("view_job", "view_chunk", "view_input")
    page = staff.get(f"/admin/jobs/job/{job.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    # The history, every JobEvent of the job.
    for event in JobEvent.objects.filter(job=job):
        assert event.actor_label in html
    assert "in_progress" in html and "QUOTED" not in html
    assert 'name="_save"' not in html  # no form to save
    assert staff.post(f"/admin/jobs/job/{job.pk}/change/", {"status": "done"}).status_code == 403
    assert Job.objects.get(pk=job.pk).status == JobStatus.IN_PROGRESS
    assert staff.post(f"/admin/jobs/job/{job.pk}/delete/", {"post": "yes"}).status_code == 403
    chunk = Chunk.objects.filter(job=job).first()
    assert chunk is not None
    assert staff.get(f"/admin/jobs/chunk/?job__id__exact={job.pk}").status_code == 200
    assert staff.get(f"/admin/jobs/chunk/{chunk.pk}/change/").status_code == 200
    input_page = staff.get(f"/admin/jobs/input/{job.input_id}/change/").content.decode()
    assert "SECRETSIG" not in input_page and "ENCRYPTEDSECRET" not in input_page
    assert staff.get("/admin/jobs/job/add/").status_code == 403
    # A staff member without the view permission sees none of it.
    assert staff_with().get(f"/admin/jobs/job/{job.pk}/change/").status_code == 403
