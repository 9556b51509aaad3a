"""Leases that hold on a fleet: a finalize whose merge outlasts its lease's stale window
keeps its lease (the worker renews it while merging), and a heartbeat whose database
connection dies (PostgreSQL restarting, a failover) reconnects at its next beat instead of
stopping."""

from __future__ import annotations

import threading
import time
from datetime import datetime
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from pytest_django import Settings

from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.services import running
from jobs.services.chunks import chunk_claim, chunk_heartbeat
from jobs.services.recovery import FINALIZE, recover
from jobs.services.running import _Heartbeat, job_finalize, job_start
from tests.db.test_fair_dispatch import approved_job, finish
from tests.dispatched import Sent, dispatch_catch, sent_run
from tests.factories import organization_make
from tests.workers import until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def short_leases(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    # A worker is dead after 1.5 s without a beat; it beats every quarter of a second.
    settings.ANEX_HEARTBEAT_STALE_SECONDS = 1.5
    dispatch_catch(monkeypatch, lambda message: None, "chunk_run_task", "job_start_task")


def test_a_merge_longer_than_the_stale_window_keeps_its_finalize(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The finalize's own lease (not the chunks' heartbeat): stale after 1.5 s, beaten
    # every 0.15 s.
    monkeypatch.setattr(running, "FINALIZE_LEASE_SECONDS", 1.5)
    finalizes: list[Sent] = []
    dispatch_catch(monkeypatch, finalizes.append, "job_finalize_task")
    job = approved_job(organization_make(), rows=2)
    job_start(job_id=job.pk)
    merging, checked = threading.Event(), threading.Event()
    write = running.result_write

    def slow_write(*args: Any, **kwargs: Any) -> Any:
        merging.set()
        # a 10M-row merge, in miniature: past the 1.5 s window, until the checks below
        checked.wait(20)
        return write(*args, **kwargs)

    monkeypatch.setattr(running, "result_write", slow_write)
    for chunk in Chunk.objects.filter(job=job).order_by("index"):
        finish(str(chunk.pk))
    [finalize] = finalizes  # sent by the last chunk's settle

    def cpu_worker() -> None:
        try:
            sent_run([finalize])
        finally:
            connection.close()

    finisher = threading.Thread(target=cpu_worker)
    finisher.start()
    assert merging.wait(10)
    time.sleep(2.1)  # the lease taken at the claim is stale by now, had it not been renewed
    try:
        assert Job.objects.get(pk=job.pk).status == JobStatus.FINALIZING
        assert not FINALIZE.due(timezone.now()).filter(pk=job.pk).exists()
        assert recover()["finalize"] == 0
    finally:
        checked.set()
    finisher.join(20)
    job.refresh_from_db()
    assert job.status == JobStatus.DONE and job.attempts == 0
    assert job_finalize(job_id=job.pk) is None  # finalized once, charged once


def test_a_heartbeat_reconnects_after_its_connection_is_killed() -> None:
    job = approved_job(organization_make(), rows=1)
    Chunk.objects.create(job=job, index=0, first_row=0, row_count=1, queued_at=timezone.now())
    chunk = Chunk.objects.get(job=job)
    assert chunk_claim(chunk_id=chunk.pk)
    pids: list[int] = []

    def beat() -> None:
        pids.append(connection.connection.info.backend_pid if connection.connection else 0)
        chunk_heartbeat(chunk_id=chunk.pk)

    with _Heartbeat(beat):
        until(lambda: len(pids) >= 2, timeout=10)  # its second beat is on an open connection
        assert pids[-1]
        # What the worker sees when PostgreSQL restarts: its session is gone.
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", [pids[-1]])
        killed_at = timezone.now()
        # the beat that meets the dead session, then one on a new connection
        until(lambda: len(set(pids)) >= 2 and beat_after(chunk, killed_at), timeout=10)
    beat_at = Chunk.objects.get(pk=chunk.pk).heartbeat_at
    assert beat_at is not None and beat_at > killed_at
    assert len(set(pids)) >= 2  # it came back on a new connection
    assert Chunk.objects.get(pk=chunk.pk).status == ChunkStatus.RUNNING


def beat_after(chunk: Chunk, moment: datetime) -> bool:
    beat_at = Chunk.objects.get(pk=chunk.pk).heartbeat_at
    return beat_at is not None and beat_at > moment


def test_a_chunk_that_ran_settles_through_a_database_restart(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The scale harness's S6 in miniature: the chunk's rows ran and its results are
    stored, and the worker's database session is gone (PostgreSQL restarted) just as it
    settles. It settles on a new connection once the database answers, instead of ending
    with the chunk left running until the stale window hands it out again."""
    import psycopg

    from jobs.services.running import chunk_run
    from tests.db.test_fair_dispatch import answer
    from tests.race import run_before

    monkeypatch.setattr(running, "SETTLE_RETRY_SECONDS", (0.2, 0.2))
    finalizes: list[Sent] = []
    dispatch_catch(monkeypatch, finalizes.append, "job_finalize_task")
    monkeypatch.setattr("jobs.services.running.execute", lambda job, rows: answer(rows))
    job = approved_job(organization_make(), rows=1)
    job_start(job_id=job.pk)
    chunk = Chunk.objects.get(job=job)
    killed: list[int] = []

    def restart(*args: object, **kwargs: object) -> None:
        # What the worker meets when PostgreSQL restarts: its session is ended under it.
        pid = connection.connection.info.backend_pid
        params = connection.get_connection_params()
        with psycopg.connect(**params, autocommit=True) as other:
            other.execute("SELECT pg_terminate_backend(%s)", [pid])
        killed.append(pid)

    with run_before("jobs.services.running.chunk_complete", restart):
        assert chunk_run(chunk_id=str(chunk.pk)) == ChunkStatus.DONE
    assert killed and connection.connection.info.backend_pid != killed[0]
    chunk.refresh_from_db()
    assert (chunk.status, chunk.attempts, chunk.deferrals) == (ChunkStatus.DONE, 1, 0)
    sent_run(finalizes)  # the finalize its settle sent, on a CPU worker
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
