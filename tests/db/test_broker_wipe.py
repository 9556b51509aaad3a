"""Issue 21, item 5: after a broker wipe (Redis flushed, or restarted with nothing saved)
work flows again at the next recovery pass, not as each lease goes stale: the pass sees the
wipe (its sentinel key gone) and sends again every message that was lost, but nothing the
broker holds already; the clock's first tick after the wipe sends that pass. Then the real
worker runs every chunk to the end, each once, and the job is charged once.

A real FLUSHDB on this test's own Redis database (FLUSHALL would empty every database on
the server, other test runs' included). Only the engine step is replaced, as in
tests/db/test_fair_dispatch.py."""

from __future__ import annotations

import time
import uuid
from collections import Counter

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from pytest_django import Settings

from anex.periodic import tick
from billing.models import EntryKind, LedgerEntry
from jobs import dispatch
from jobs.constants import ChunkStatus, JobStatus
from jobs.dispatch import run_queue
from jobs.models import Chunk, Job
from jobs.services.chunks import IN_FLIGHT
from jobs.services.recovery import recover
from jobs.services.running import job_start
from tests.db.test_fair_dispatch import MODEL, answer, approved_job, finish
from tests.dispatched import dispatch_catch
from tests.factories import organization_make
from tests.workers import broker_flush, running_worker, until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def small_room(settings: Settings) -> None:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_DISPATCH_IN_FLIGHT = settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 3
    settings.ANEX_WORKER_REGIONS = ["world"]
    settings.ANEX_WORKER_MODELS = [MODEL]


def queued_chunks(job: Job) -> Counter[str]:
    """Every message of this job's chunks the broker holds, by chunk id (a duplicate counts
    twice); another test's chunk on the model's queue is not this test's to count."""
    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    key = f"{broker.namespace}:{run_queue('world', MODEL)}.msgs"
    ours = {str(pk) for pk in Chunk.objects.filter(job=job).values_list("pk", flat=True)}
    chunk_ids = (str(dramatiq.Message.decode(raw).args[0]) for raw in broker.client.hvals(key))
    return Counter(chunk_id for chunk_id in chunk_ids if chunk_id in ours)


def test_after_a_wipe_the_next_pass_resends_what_was_lost_and_nothing_twice(
        monkeypatch: pytest.MonkeyPatch) -> None:
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")  # started here
    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    broker_flush()
    dispatch.run_queues_declare()
    recover()  # the broker's sentinel is set: no wipe seen from here on
    assert recover()["broker wiped"] == 0
    job = approved_job(organization_make(), rows=6)
    assert job_start(job_id=job.pk) == 3
    sent = set(queued_chunks(job))
    assert len(sent) == 3
    # The clock has fired this period's recovery pass already: it waits for the next.
    now = time.time()
    tick(now)
    assert "jobs.tasks.recover_task" not in tick(now)
    # Another organization's job waits for its estimate.
    estimating = approved_job(organization_make(), rows=1)
    Job.objects.filter(pk=estimating.pk).update(status=JobStatus.SUBMITTED)

    # when: Redis loses everything (FLUSHDB: this test's database only)
    broker.client.flushdb()
    # A worker had taken one chunk before the wipe, and now ends it: its place goes to the
    # next chunk, sent after the wipe, so the broker holds that one.
    taken = next(iter(sent))
    finish(taken)
    assert len(queued_chunks(job)) == 1
    after_wipe = set(queued_chunks(job))

    # then: the clock's first tick sends the recovery pass at once (its period's lock went
    # with the wipe), and that pass sends again the two lost chunks and the lost estimate,
    # not the chunk the broker holds
    assert "jobs.tasks.recover_task" in tick(now)
    counts = recover()
    assert counts["broker wiped"] == 3
    queued = queued_chunks(job)
    assert set(queued) == (sent - {taken}) | after_wipe
    assert max(queued.values()) == 1  # nothing twice
    assert {str(c) for c in Chunk.objects.filter(IN_FLIGHT, job=job).values_list(
        "pk", flat=True)} == set(queued)
    assert dispatch.broker_held("job_estimate_task") == {str(estimating.pk)}
    assert recover()["broker wiped"] == 0  # seen once

    # and the worker runs the rest, every chunk once, the job charged once
    Job.objects.filter(pk=estimating.pk).update(status=JobStatus.CANCELLED)
    ran: list[uuid.UUID] = []

    def engine_step(job: Job, rows: list) -> tuple:  # type: ignore[type-arg]
        ran.append(rows[0].index)
        return answer(rows)

    monkeypatch.setattr("jobs.services.running.execute", engine_step)
    with running_worker(threads=2):
        until(lambda: Job.objects.get(pk=job.pk).status == JobStatus.DONE, timeout=120)
    assert sorted(ran) == [i for i in range(6)
                           if str(Chunk.objects.get(job=job, index=i).pk) != taken]
    assert Chunk.objects.filter(job=job, status=ChunkStatus.DONE).count() == 6
    assert LedgerEntry.objects.filter(job=job, kind=EntryKind.CHARGE).count() == 1
