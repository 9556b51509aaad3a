"""The chunk state machine (jobs.services.chunks): the one writer of Chunk.status and of a
chunk's lease, every move a guarded UPDATE checked against CHUNK_TRANSITIONS - a repeat is
a no-op, an illegal move is refused, a move the recovery pass makes yields to a worker
that beat meanwhile, and of concurrent claims one wins."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from pytest_django import Settings

from inference.constants import RowOutcome
from inference.pricing import Usage, usage_json
from jobs.constants import CHUNK_SETTLED, CHUNK_TRANSITIONS, ChunkStatus
from jobs.models import Chunk
from jobs.services.chunks import (
    chunk_claim,
    chunk_complete,
    chunk_fail,
    chunk_heartbeat,
    chunk_requeue,
    chunk_send,
    chunk_transition,
    chunks_skip_pending,
)
from jobs.services.lifecycle import job_approve
from tests.dispatched import Sent, dispatch_catch
from tests.factories import SYSTEM, job_make, organization_make
from tests.product import writers

# What a chunk's lease is made of: only jobs.services.chunks writes these, or its status.
CHUNK_LEASE = {"status", "attempts", "queued_at", "heartbeat_at", "finished_at"}


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    calls: list[Sent] = []
    dispatch_catch(monkeypatch, calls.append, "chunk_run_task")
    return calls


def chunk_in(status: ChunkStatus, **fields: Any) -> Chunk:
    """A chunk of an approved job (one in_progress, as a running chunk's is), in `status`."""
    job = job_approve(job=job_make(organization_make(), est_cost_cents=10), actor=SYSTEM)
    return Chunk.objects.create(job=job, index=0, first_row=0, row_count=2, status=status,
                                **fields)


def row(chunk: Chunk) -> dict[str, Any]:
    return dict(Chunk.objects.filter(pk=chunk.pk).values().get())


MOVES = [(src, to) for src, targets in CHUNK_TRANSITIONS.items() for to in sorted(targets)]


@pytest.mark.django_db
@pytest.mark.parametrize("src,to", MOVES, ids=[f"{s}->{t}" for s, t in MOVES])
def test_every_allowed_chunk_move_writes_its_state_once(src: ChunkStatus,
                                                        to: ChunkStatus) -> None:
    chunk = chunk_in(src, attempts=1)
    before = timezone.now()
    assert chunk_transition(chunk_id=chunk.pk, to=to) is True
    moved = row(chunk)
    assert moved["status"] == to
    # The state entered writes its own lease fields in the same UPDATE.
    if to == ChunkStatus.RUNNING:
        assert moved["attempts"] == 2 and moved["heartbeat_at"] >= before
    elif to == ChunkStatus.PENDING:
        assert moved["attempts"] == 1 and moved["queued_at"] >= before
    else:
        assert to in CHUNK_SETTLED and moved["finished_at"] >= before
    # A repeat is refused and writes nothing (no second attempt, no later finish).
    assert chunk_transition(chunk_id=chunk.pk, to=to) is False
    assert row(chunk) == moved


@pytest.mark.django_db
@pytest.mark.parametrize("src,to", [(s, t) for s in ChunkStatus for t in ChunkStatus
                                    if t not in CHUNK_TRANSITIONS[s]])
def test_every_other_chunk_move_is_refused(src: ChunkStatus, to: ChunkStatus) -> None:
    chunk = chunk_in(src)
    before = row(chunk)
    assert chunk_transition(chunk_id=chunk.pk, to=to) is False
    assert row(chunk) == before


def test_the_table_is_whole_and_a_settled_chunk_never_moves() -> None:
    assert set(CHUNK_TRANSITIONS) == set(ChunkStatus)
    assert CHUNK_SETTLED == {s for s, targets in CHUNK_TRANSITIONS.items() if not targets}
    with pytest.raises(ValueError, match="is not a chunk transition"):
        chunk_transition(chunk_id="00000000-0000-0000-0000-000000000000",
                         to=ChunkStatus.DONE, sources=frozenset({ChunkStatus.PENDING}))


@pytest.mark.django_db
def test_a_chunks_counts_are_recorded_once() -> None:
    chunk = chunk_in(ChunkStatus.RUNNING)
    counts = {RowOutcome.SUCCESS: 1, RowOutcome.ERROR: 1}
    assert chunk_complete(chunk_id=chunk.pk, counts=counts, usage=Usage(input_tokens=7))
    # A redelivered chunk's second finish changes nothing.
    assert not chunk_complete(chunk_id=chunk.pk, counts={RowOutcome.SUCCESS: 2},
                              usage=Usage(input_tokens=99))
    done = Chunk.objects.get(pk=chunk.pk)
    assert (done.status, done.success_rows, done.error_rows) == (ChunkStatus.DONE, 1, 1)
    assert done.usage == usage_json(Usage(input_tokens=7))


@pytest.mark.django_db
def test_a_requeue_sends_only_the_move_it_made(sent: list[Sent]) -> None:
    chunk = chunk_in(ChunkStatus.RUNNING)
    assert chunk_requeue(chunk=chunk, delay_ms=5_000)
    assert not chunk_requeue(chunk=chunk, delay_ms=5_000)  # already pending: no message
    assert [(m.id, m.delay_ms) for m in sent] == [(str(chunk.pk), 5_000)]
    assert Chunk.objects.get(pk=chunk.pk).status == ChunkStatus.PENDING


@pytest.mark.django_db
def test_a_pending_chunk_is_sent_once_per_send_read(sent: list[Sent]) -> None:
    chunk = chunk_in(ChunkStatus.PENDING)
    # Two recovery passes that read the same stale send: one message.
    first, second = Chunk.objects.get(pk=chunk.pk), Chunk.objects.get(pk=chunk.pk)
    assert chunk_send(chunk=first) and not chunk_send(chunk=second)
    assert [m.id for m in sent] == [str(chunk.pk)]
    # A chunk claimed meanwhile is not sent again.
    taken = Chunk.objects.get(pk=chunk.pk)
    assert chunk_claim(chunk_id=chunk.pk)
    assert not chunk_send(chunk=taken)
    assert len(sent) == 1


@pytest.mark.django_db
def test_the_reapers_moves_yield_to_a_worker_that_beat_meanwhile(sent: list[Sent]) -> None:
    long_ago = timezone.now() - timedelta(hours=1)
    chunk = chunk_in(ChunkStatus.RUNNING, heartbeat_at=long_ago)
    stale = Chunk.objects.get(pk=chunk.pk)  # as the recovery pass read it
    assert chunk_heartbeat(chunk_id=chunk.pk)  # the worker is alive after all
    assert not chunk_requeue(chunk=stale, reaped=True)
    assert not chunk_fail(chunk=stale, reaped=True)
    assert (Chunk.objects.get(pk=chunk.pk).status, sent) == (ChunkStatus.RUNNING, [])
    # Read again, stale for real: taken back once.
    Chunk.objects.filter(pk=chunk.pk).update(heartbeat_at=long_ago)
    stale = Chunk.objects.get(pk=chunk.pk)
    assert chunk_requeue(chunk=stale, reaped=True)
    assert not chunk_requeue(chunk=stale, reaped=True)
    assert [m.id for m in sent] == [str(chunk.pk)]


@pytest.mark.django_db
def test_a_cancel_skips_only_the_chunks_not_started() -> None:
    running = chunk_in(ChunkStatus.RUNNING)
    pending = Chunk.objects.create(job=running.job, index=1, first_row=2, row_count=2)
    assert chunks_skip_pending(job_id=running.job_id) == 1
    assert chunks_skip_pending(job_id=running.job_id) == 0
    statuses = dict(Chunk.objects.filter(job=running.job).values_list("index", "status"))
    assert statuses == {0: ChunkStatus.RUNNING, 1: ChunkStatus.SKIPPED}
    assert Chunk.objects.get(pk=pending.pk).finished_at is not None


def race(worker: Callable[[], Any], threads: int = 20) -> list[Any]:
    """`worker` in `threads` threads released at once, each on its own connection."""
    barrier = threading.Barrier(threads)
    results: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait(30)  # one that never arrives fails the test, not hangs it
            outcome = worker()
        finally:
            connection.close()
        with lock:
            results.append(outcome)

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(timeout=120)
    return results


@pytest.mark.django_db(transaction=True)
def test_twenty_workers_claiming_one_chunk_run_it_once(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 1000
    chunk = chunk_in(ChunkStatus.PENDING)
    outcomes = race(lambda: chunk_claim(chunk_id=chunk.pk))
    assert sorted(outcomes) == [False] * 19 + [True]
    claimed = Chunk.objects.get(pk=chunk.pk)
    assert (claimed.status, claimed.attempts) == (ChunkStatus.RUNNING, 1)


def test_chunk_status_and_lease_are_written_only_by_the_chunks_module() -> None:
    """Chunk.status was written in running, recovery and lifecycle (the cancel)."""
    assert writers("Chunk", CHUNK_LEASE, related="chunks") == {"jobs/services/chunks.py"}


def test_a_jobs_lease_is_written_only_by_the_lifecycle() -> None:
    """The job's lease fields were written by sampling and recovery too."""
    assert writers("Job", {"leased_at", "claimed", "attempts"}) == {
        "jobs/services/lifecycle.py"}
