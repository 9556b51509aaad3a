"""Finalize in one place (issue 42 item 1): its own actor on the CPU workers' jobs queue,
sent by the chunk that settles last, by a start with no rows and by the recovery pass, never
run where it is decided; its time limit sized for its job's merge, its lease its own; run
twice, it charges once.

The merge is slowed by the storage it reads (a wrapper whose reads wait), never by a sleep
in the product: a recovered finalize whose merge outlasts the recovery pass's own time
limit still ends done."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import pytest
from django.db import connection
from django.utils import timezone
from dramatiq.brokers.redis import RedisBroker
from pytest_django import Settings

from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_summary
from console.models import Organization
from inference.constants import RowOutcome
from jobs import dispatch, results
from jobs.constants import JobStatus
from jobs.models import Input, Job
from jobs.services import running
from jobs.services.lifecycle import WORKER, job_approve, job_transition
from jobs.services.recovery import FINALIZE, FINALIZE_UNCLAIMED, lease_recover, recover
from jobs.services.running import finalize_stale, job_start
from jobs.storage import storage_for
from jobs.tasks import SWEEP_TIME_LIMIT_MS, job_finalize_task, recover_task
from tests.db.test_fair_dispatch import approved_job, finish
from tests.db.test_running import complete
from tests.dispatched import Sent, committed, dispatch_catch, finalizes_run, sent_run
from tests.factories import (
    SYSTEM,
    chat_request_line,
    input_ready,
    job_make,
    organization_make,
)
from tests.race import run_before
from tests.workers import broker_flush, fresh_worker, time_limits_enforced

GRANT = 10_000


@pytest.fixture(autouse=True)
def one_row_chunks(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = GRANT
    # Chunks and starts are run by the tests themselves.
    dispatch_catch(monkeypatch, lambda message: None, "chunk_run_task", "job_start_task")


def charges(job: Job) -> int:
    return LedgerEntry.objects.filter(job_id=job.pk, kind=EntryKind.CHARGE).count()


def ledger_checks(organization: Organization, job: Job, *, charged: bool = True) -> None:
    """The job charged once (`charged`; else not at all), its hold released, and the
    balance the entries' sum."""
    entries = LedgerEntry.objects.filter(organization=organization)
    balance = sum(entry.balance_delta for entry in entries)
    held = sum(entry.held_delta for entry in entries)
    assert (charges(job), bool(job.cost_cents)) == (int(charged), charged)
    assert (balance, held) == (GRANT - (job.cost_cents or 0), 0)
    summary = credits_summary(organization=organization)
    assert (summary.balance, summary.held) == (balance, held)


def the_finalize_of(job: Job, messages: list[Sent]) -> Sent:
    [message] = messages
    assert (message.actor, message.id, message.queue) == ("job_finalize_task", str(job.pk),
                                                          dispatch.JOBS)
    assert message.time_limit_ms == dispatch.finalize_time_limit_ms(job.row_count or 0)
    return message


# --- sent, never run where it is decided ------------------------------------------------


@pytest.mark.django_db
def test_the_last_chunks_settle_sends_the_finalize_and_merges_nothing(
        monkeypatch: pytest.MonkeyPatch) -> None:
    merges: list[str] = []
    write = running.result_write

    def counted(job: Job, *args: Any, **kwargs: Any) -> Any:
        merges.append(threading.current_thread().name)
        return write(job, *args, **kwargs)

    monkeypatch.setattr(running, "result_write", counted)
    organization = organization_make()
    job = approved_job(organization, rows=2)
    job_start(job_id=job.pk)
    first, last = job.chunks.order_by("index")
    with committed(monkeypatch, "job_finalize_task") as sent:
        finish(str(first.pk))
    assert sent == []  # a chunk is still running
    with committed(monkeypatch, "job_finalize_task") as sent:
        finish(str(last.pk))  # a GPU worker's thread, settling the job's last chunk
    job.refresh_from_db()
    # Nothing of the finalize ran on the settling thread: not even its claim.
    assert (job.status, merges) == (JobStatus.IN_PROGRESS, [])
    message = the_finalize_of(job, sent)
    sent_run([message])  # a CPU worker takes it
    job.refresh_from_db()
    assert job.status == JobStatus.DONE and len(merges) == 1
    ledger_checks(organization, job)


@pytest.mark.django_db
def test_a_start_with_no_rows_finalizes_through_the_actor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    organization = organization_make()
    item = input_ready(organization, chat_request_line("r0"))
    # Its stored object now blank lines, unpinned: the start plans no chunk.
    storage_for("world").write_stream(item.object_key, iter([b"\n\n"]), max_bytes=10)
    Input.objects.filter(pk=item.pk).update(content_pin="")
    job = job_make(organization, est_cost_cents=100, model="gemma4-12b")
    Job.objects.filter(pk=job.pk).update(input=item, row_count=0)
    job = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    with committed(monkeypatch, "job_finalize_task") as sent:
        assert job_start(job_id=job.pk) == 0
    job.refresh_from_db()
    assert job.status == JobStatus.IN_PROGRESS and not job.chunks.exists()
    sent_run([the_finalize_of(job, sent)])
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
    ledger_checks(organization, job, charged=False)  # no row ran: nothing to charge


@pytest.mark.django_db
@pytest.mark.parametrize("lease", [FINALIZE_UNCLAIMED, FINALIZE], ids=lambda lease: lease.what)
def test_the_recovery_pass_sends_the_finalize_and_merges_nothing(
        monkeypatch: pytest.MonkeyPatch, lease: Any) -> None:
    monkeypatch.setattr(running, "result_write", lambda *a, **k: pytest.fail("merged"))
    job = approved_job(organization_make(), rows=2)
    job_start(job_id=job.pk)
    for chunk in job.chunks.all():
        complete(chunk, [RowOutcome.SUCCESS])
    if lease is FINALIZE:  # a worker took the finalize, and died merging
        job_transition(job=job, to=JobStatus.FINALIZING, actor=WORKER)
    later = timezone.now() + finalize_stale() + timedelta(seconds=1)
    with committed(monkeypatch, "job_finalize_task") as sent:
        assert lease_recover(lease, later) == 1
    job.refresh_from_db()
    assert job.status == (JobStatus.FINALIZING if lease is FINALIZE else JobStatus.IN_PROGRESS)
    the_finalize_of(job, sent)
    assert job.attempts == 1
    # Sent again only once its own lease runs out again, not at every pass.
    with committed(monkeypatch, "job_finalize_task") as sent:
        assert lease_recover(lease, timezone.now()) == 0
    assert sent == []


@pytest.mark.django_db
def test_a_finalize_message_never_taken_waits_its_own_lease_not_the_chunks(
        settings: Settings) -> None:
    settings.ANEX_HEARTBEAT_STALE_SECONDS = 5
    job = approved_job(organization_make(), rows=1)
    job_start(job_id=job.pk)
    complete(job.chunks.get(), [RowOutcome.SUCCESS])
    # Long after approval, but just after its last chunk settled (and sent the finalize):
    # not lost, only waiting its turn on the jobs queue.
    Job.objects.filter(pk=job.pk).update(leased_at=timezone.now() - timedelta(days=1))
    soon = timezone.now() + timedelta(seconds=60)
    assert not FINALIZE_UNCLAIMED.due(soon).filter(pk=job.pk).exists()
    assert FINALIZE_UNCLAIMED.due(soon + finalize_stale()).filter(pk=job.pk).exists()


# The slowest merge the benchmarks recorded (bench/RESULTS.md, "Finalize merge").
SLOWEST_MERGE_ROWS_PER_SECOND = 1_100


def test_the_time_limit_covers_the_slowest_merge_recorded() -> None:
    """Every size, from none to ten million rows, merges within its finalize's limit at
    the slowest rate recorded, with half as much again to spare, and the smallest still
    has more than the recovery pass's own limit."""
    for rows in (0, 1, 20_000, 1_000_000, 10_000_000):
        limit_ms = dispatch.finalize_time_limit_ms(rows)
        assert limit_ms >= 1.5 * 1000 * rows / SLOWEST_MERGE_ROWS_PER_SECOND
        assert limit_ms > SWEEP_TIME_LIMIT_MS


@pytest.mark.django_db(transaction=True)
def test_after_a_broker_wipe_a_waiting_finalize_is_sent_again_once() -> None:
    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    broker_flush()
    recover()  # the broker's sentinel is set: no wipe seen from here on
    job = approved_job(organization_make(), rows=2)
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        finish(str(chunk.pk))

    def finalizes_held() -> list[tuple[str, int | None]]:
        """The finalize messages on the jobs queue: their job, their own time limit."""
        messages = [dramatiq.Message.decode(raw) for raw in broker.client.hvals(
            f"{broker.namespace}:{dispatch.JOBS}.msgs")]
        return [(str(m.args[0]), m.options.get("time_limit")) for m in messages
                if m.actor_name == "job_finalize_task"]

    sent = [(str(job.pk), dispatch.finalize_time_limit_ms(2))]
    assert finalizes_held() == sent  # the last settle's, with its limit
    broker.client.flushdb()  # Redis loses everything
    assert recover()["broker wiped"] == 1
    assert finalizes_held() == sent
    assert recover()["broker wiped"] == 0 and finalizes_held() == sent  # nothing twice
    broker_flush()


# --- run twice, charged once --------------------------------------------------------------


@pytest.mark.django_db
def test_a_finalize_delivered_twice_charges_once(monkeypatch: pytest.MonkeyPatch) -> None:
    organization = organization_make()
    job = approved_job(organization, rows=2)
    job_start(job_id=job.pk)
    with finalizes_run(monkeypatch) as sent:
        for chunk in job.chunks.order_by("index"):
            finish(str(chunk.pk))
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
    sent_run(sent)  # the same message again: the broker redelivered it
    job_finalize_task(str(job.pk))
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
    ledger_checks(organization, job)


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_taken_while_the_first_merges_charges_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two workers hold the same finalize at once (a redelivery, or the recovery pass's
    message and the settle's): the second arrives in the first one's merge, on its own
    connection, finds the finalize claimed, and does nothing."""
    organization = organization_make()
    job = approved_job(organization, rows=2)
    job_start(job_id=job.pk)
    sent: list[Sent] = []
    dispatch_catch(monkeypatch, sent.append, "job_finalize_task")
    for chunk in job.chunks.order_by("index"):
        finish(str(chunk.pk))
    second: list[object] = []

    def other_worker(*args: Any, **kwargs: Any) -> None:
        def take() -> None:
            try:
                second.append(job_finalize_task(str(job.pk)))
            finally:
                connection.close()

        thread = threading.Thread(target=take)
        thread.start()
        thread.join(30)

    with run_before("jobs.services.running.result_write", other_worker):
        sent_run([the_finalize_of(job, sent)])
    job.refresh_from_db()
    assert second == [None] and job.status == JobStatus.DONE
    ledger_checks(organization, job)


# --- a recovered finalize that outlasts the recovery pass's limit --------------------------


class SlowStorage:
    """A region's storage whose every read of a chunk's results waits `seconds` (S3 at its
    slowest, for a large job, in miniature), in short steps: Dramatiq's time limit stops a
    thread between two steps, as it would between two reads."""

    def __init__(self, storage: Any, seconds: float) -> None:
        self.storage, self.seconds = storage, seconds

    def read_each(self, keys: Iterable[str], **kwargs: Any) -> Iterator[bytes]:
        for data in self.storage.read_each(keys, **kwargs):
            deadline = time.monotonic() + self.seconds
            while time.monotonic() < deadline:
                time.sleep(0.05)
            yield data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.storage, name)


@pytest.mark.django_db(transaction=True)
def test_a_recovered_finalize_whose_merge_outlasts_the_sweeps_limit_ends_done_billed_once(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The recovery pass's own limit (jobs.tasks.SWEEP_TIME_LIMIT_MS, 5 minutes) scaled to
    a second, and a merge of 4 seconds (its storage's reads slowed): the pass sends the
    finalize and ends; the finalize runs on the jobs queue within its own, sized limit, and
    the job ends done, charged once. Run inside the pass, the merge was stopped by the
    pass's limit at every attempt, and the job failed internal_error."""
    time_limits_enforced()
    monkeypatch.setitem(recover_task.options, "time_limit", 1_000)
    organization = organization_make()
    job = approved_job(organization, rows=4)
    job_start(job_id=job.pk)
    for chunk in job.chunks.all():
        complete(chunk, [RowOutcome.SUCCESS])
    # A worker took the finalize and died merging: its lease went stale.
    job_transition(job=job, to=JobStatus.FINALIZING, actor=WORKER)
    Job.objects.filter(pk=job.pk).update(
        leased_at=timezone.now() - finalize_stale() - timedelta(seconds=1))
    storage_for = results.storage_for
    monkeypatch.setattr(results, "storage_for",
                        lambda region: SlowStorage(storage_for(region), seconds=1.0))

    def ended() -> bool:
        return Job.objects.get(pk=job.pk).status != JobStatus.FINALIZING

    with fresh_worker(threads=2) as until:
        recover_task.send()
        until(ended, timeout=120)
    job.refresh_from_db()
    assert (job.status, job.success_rows) == (JobStatus.DONE, 4)
    ledger_checks(organization, job)
