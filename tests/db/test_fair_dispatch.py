"""Fair dispatch (jobs.services.chunks.chunks_release): a model's chunks are sent as room
frees, the next place going to the organization with the fewest chunks in flight, so a
small job is not held behind a large one; the database is the only record, so two
dispatchers send nothing twice and a start that died is caught by the recovery pass.

The worker test runs the real Dramatiq worker on the real Redis broker and PostgreSQL; only
the engine step is replaced, by a deterministic answer per row (this tier has no vLLM; the
engines are run for real in tests/e2e)."""

from __future__ import annotations

import json
import threading
import uuid
from collections import Counter
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
from django.db import connection
from django.utils import timezone
from pytest_django import Settings

from console.models import Organization
from inference.constants import RowOutcome
from inference.kinds.base import InputRow
from inference.pricing import Usage, usage_json
from jobs.constants import ChunkStatus, JobStatus
from jobs.dispatch import run_queue
from jobs.models import Chunk, Job
from jobs.services.chunks import IN_FLIGHT, Waiting, chunk_claim, fair_picks
from jobs.services.lifecycle import job_approve, job_cancel
from jobs.services.recovery import recover
from jobs.services.running import chunk_settle, job_start
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, chat_request_line, input_ready, job_make, organization_make
from tests.workers import broker_flush, running_worker, until

MODEL = "gemma4-12b"


@pytest.fixture(autouse=True)
def one_row_chunks(settings: Settings) -> None:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_DISPATCH_IN_FLIGHT = 2
    settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 2


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The chunk ids sent to the run queues, in order (nothing consumes them here; the
    tests start their jobs themselves)."""
    ids: list[str] = []
    dispatch_catch(monkeypatch, lambda message: ids.append(message.id), "chunk_run_task")
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")
    return ids


def approved_job(organization: Organization, rows: int) -> Job:
    item = input_ready(organization, b"".join(chat_request_line(f"r{i}") for i in range(rows)))
    job = job_make(organization, est_cost_cents=5_000, model=MODEL)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, max_output_tokens=50)
    return job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)


def answer(rows: list[InputRow]) -> tuple[list[dict[str, Any]], Usage]:
    """The replaced engine step: each row answered with its own index."""
    usage = Usage(input_tokens=3, output_tokens=2)
    return [{"i": row.index, "id": row.ident, "outcome": RowOutcome.SUCCESS.value,
             "status_code": 200, "body": {"choices": [{"message": {"content": f"a{row.index}"}}]},
             "error": None, "output": f"a{row.index}", "embedding": None,
             "usage": usage_json(usage)} for row in rows], Usage(
        input_tokens=3 * len(rows), output_tokens=2 * len(rows))


def finish(chunk_id: str) -> None:
    """A worker's run of one chunk, as chunk_run ends it (its result object, then the
    settle that releases the next place)."""
    from jobs.results import chunk_key
    from jobs.storage import storage_for

    assert chunk_claim(chunk_id=chunk_id)
    chunk = Chunk.objects.select_related("job").get(pk=chunk_id)
    line = json.dumps(answer([InputRow(index=chunk.first_row, ident=f"r{chunk.first_row}",
                                       body={})])[0][0]).encode() + b"\n"
    storage_for("world").write_stream(chunk_key(chunk.job, chunk.index), iter([line]),
                                      max_bytes=10**6)
    assert chunk_settle(chunk=chunk, to=ChunkStatus.DONE, usage=Usage(input_tokens=3),
                        counts={RowOutcome.SUCCESS: 1})


def job_of(chunk_id: str) -> uuid.UUID:
    return Chunk.objects.get(pk=chunk_id).job_id


def test_the_next_place_goes_to_the_organization_with_fewest_in_flight() -> None:
    a, b, c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    now = timezone.now()
    jobs = [Waiting(job_id=a, organization_id=a, approved_at=now, waiting=100, in_flight=3),
            Waiting(job_id=b, organization_id=b, approved_at=now + timedelta(seconds=1),
                    waiting=2, in_flight=0),
            Waiting(job_id=c, organization_id=a, approved_at=now, waiting=5, in_flight=0)]
    # b has nothing in flight, a three: b first; then b again (1 < 3), then a's idle job c.
    assert fair_picks(jobs, Counter({a: 3}), 4, job_cap=10) == [b, b, c, c]
    # A job at its cap takes no more, whatever room is left.
    jobs = [Waiting(job_id=a, organization_id=a, approved_at=now, waiting=100, in_flight=0)]
    assert fair_picks(jobs, Counter(), 5, job_cap=2) == [a, a]


@pytest.mark.django_db
def test_a_small_job_gets_the_next_place_however_large_the_running_job(sent: list[str]) -> None:
    large = approved_job(organization_make(), rows=12)
    assert job_start(job_id=large.pk) == 2  # the model's whole room: 2
    small = approved_job(organization_make(), rows=2)
    assert job_start(job_id=small.pk) == 0  # no room until a chunk ends
    assert [job_of(i) for i in sent] == [large.pk, large.pk]
    finish(sent[0])
    # The freed place goes to the organization with nothing in flight.
    assert job_of(sent[2]) == small.pk
    finish(sent[1])
    assert job_of(sent[3]) == large.pk  # each organization now has one in flight
    finish(sent[2])
    assert job_of(sent[4]) == small.pk
    assert Chunk.objects.filter(IN_FLIGHT, job__model=MODEL).count() == 2
    # Never more than the room, never one chunk twice.
    assert len(sent) == len(set(sent))


@pytest.mark.django_db
def test_a_job_takes_no_more_than_its_own_cap(settings: Settings, sent: list[str]) -> None:
    settings.ANEX_DISPATCH_IN_FLIGHT = 10
    settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 3
    job = approved_job(organization_make(), rows=8)
    assert job_start(job_id=job.pk) == 3
    finish(sent[0])
    assert len(sent) == 4 and Chunk.objects.filter(IN_FLIGHT, job=job).count() == 3


@pytest.mark.django_db(transaction=True)
def test_two_dispatchers_at_once_send_nothing_twice(settings: Settings, sent: list[str]) -> None:
    from jobs.services.chunks import chunks_release

    settings.ANEX_DISPATCH_IN_FLIGHT = settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 5
    job = approved_job(organization_make(), rows=20)
    Chunk.objects.bulk_create(
        Chunk(job=job, index=i, first_row=i, row_count=1) for i in range(20))
    barrier = threading.Barrier(4)

    def release() -> None:
        try:
            barrier.wait(30)  # one that never arrives fails the test, not hangs it
            chunks_release(region="world", model=MODEL)
        finally:
            connection.close()

    threads = [threading.Thread(target=release) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(sent) == len(set(sent)) == 5
    assert Chunk.objects.filter(IN_FLIGHT).count() == 5


@pytest.mark.django_db
def test_chunks_a_dead_start_never_sent_are_sent_by_the_recovery_pass(
        sent: list[str]) -> None:
    job = approved_job(organization_make(), rows=3)
    # The start planned its chunks and died before releasing any.
    Chunk.objects.bulk_create(Chunk(job=job, index=i, first_row=i, row_count=1)
                              for i in range(3))
    assert recover()["chunk release"] == 2
    assert {job_of(i) for i in sent} == {job.pk} and len(sent) == 2


@pytest.mark.django_db
def test_a_cancel_skips_the_chunks_never_sent_and_the_job_still_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    finalizes: list[str] = []
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "chunk_run_task")
    dispatch_catch(monkeypatch, lambda message: finalizes.append(message.id),
                   "job_finalize_task")
    job = approved_job(organization_make(), rows=6)
    job_start(job_id=job.pk)
    finish(sent[0])
    finish(sent[1])
    # Two chunks done, two sent and not yet taken, two waiting: cancelling, and the two
    # waiting are skipped at once (no message of theirs exists to skip them).
    cancelled = job_cancel(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    assert cancelled.status == JobStatus.CANCELLING
    statuses = Counter(Chunk.objects.filter(job=job).values_list("status", flat=True))
    assert statuses == {ChunkStatus.DONE: 2, ChunkStatus.PENDING: 2, ChunkStatus.SKIPPED: 2}
    assert finalizes == []  # the sent ones end it when they are taken


@pytest.mark.django_db(transaction=True)
def test_through_the_broker_a_small_job_finishes_long_before_the_large_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[uuid.UUID] = []

    def engine_step(job: Job, rows: list[InputRow]) -> tuple[list[dict[str, Any]], Usage]:
        ran.append(job.pk)
        return answer(rows)

    monkeypatch.setattr("jobs.services.running.execute", engine_step)
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")  # started here
    broker = dramatiq.get_broker()
    broker_flush()
    broker.declare_queue(run_queue("world", MODEL))
    large = approved_job(organization_make(), rows=14)
    small = approved_job(organization_make(), rows=2)
    # Both started before a worker takes anything: the queue holds the large job's two
    # chunks only, the small job's wait their turn in the database.
    assert job_start(job_id=large.pk) == 2
    assert job_start(job_id=small.pk) == 0

    def done() -> bool:
        return Job.objects.filter(pk__in=[large.pk, small.pk],
                                  status=JobStatus.DONE).count() == 2

    with running_worker(threads=1):
        until(done, timeout=120)
    # The small job's two chunks ran among the first five, not after the large job's 14.
    assert ran.index(small.pk) <= 2 and len(ran) - ran[::-1].index(small.pk) <= 5
    assert Counter(ran) == {large.pk: 14, small.pk: 2}  # every chunk once
    for job in (large, small):
        job.refresh_from_db()
        assert job.success_rows == job.row_count and job.cost_cents is not None
