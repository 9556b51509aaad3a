"""A chunk's failure is classed (jobs.failures): the infrastructure's or the engine's costs
it no attempt and backs off with jitter, its own spends one, and a worker whose engine keeps
failing stops taking the model's chunks (its breaker) instead of failing each one."""

from __future__ import annotations

import pytest
from botocore.exceptions import EndpointConnectionError
from django.db import OperationalError
from pytest_django import Settings

from jobs.constants import ChunkStatus
from jobs.failures import FailureClass, breakers_open, failure_class
from jobs.models import Chunk
from jobs.services.running import CHUNK_DEFERRALS, chunk_run, job_start
from tests.db.test_fair_dispatch import approved_job
from tests.dispatched import Sent, dispatch_catch
from tests.factories import organization_make

pytestmark = pytest.mark.django_db
MODEL = "gemma4-12b"


class EngineDeadError(RuntimeError):
    """vLLM's own name (vllm.v1.engine.exceptions) for an engine that stopped; the class is
    read by name so that the worker's classification needs no vLLM import."""


@pytest.fixture(autouse=True)
def one_row_chunks(settings: Settings) -> None:
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_FREE_GRANT_CENTS = 10_000


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    messages: list[Sent] = []
    dispatch_catch(monkeypatch, messages.append, "chunk_run_task")
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")
    return messages


def test_failures_are_classed_by_what_raised_them() -> None:
    assert failure_class(EndpointConnectionError(endpoint_url="https://s3")) \
        == FailureClass.INFRASTRUCTURE
    assert failure_class(OperationalError("server closed the connection")) \
        == FailureClass.INFRASTRUCTURE
    wrapped = RuntimeError("read failed")
    wrapped.__cause__ = ConnectionResetError()
    assert failure_class(wrapped) == FailureClass.INFRASTRUCTURE
    assert failure_class(EngineDeadError()) == FailureClass.ENGINE
    assert failure_class(ValueError("a row the code did not expect")) == FailureClass.UNEXPECTED


def test_a_storage_outage_costs_no_attempt_and_backs_off_with_jitter(
        monkeypatch: pytest.MonkeyPatch, sent: list[Sent]) -> None:
    job = approved_job(organization_make(), rows=1)
    job_start(job_id=job.pk)

    def outage(*args: object) -> None:
        raise EndpointConnectionError(endpoint_url="https://s3.example")

    monkeypatch.setattr("jobs.services.running.rows_read", outage)
    delays = []
    for _ in range(4):
        assert chunk_run(chunk_id=sent[-1].id) == ChunkStatus.PENDING
        delays.append(sent[-1].delay_ms)
    chunk = Chunk.objects.get(job=job)
    assert (chunk.status, chunk.attempts, chunk.deferrals) == (ChunkStatus.PENDING, 0, 4)
    # 15 s doubling (7.5-15 s, 15-30 s, 30-60 s, 60-120 s): about a minute and a half
    # waited out in four tries, where three attempts used to go in 15 s.
    for n, delay in enumerate(delays):
        ceiling = 15_000 * 2 ** n
        assert delay is not None and ceiling // 2 <= delay <= ceiling
    assert sum(d or 0 for d in delays) >= 56_000


def test_past_its_deferrals_an_outage_counts_as_attempts(
        monkeypatch: pytest.MonkeyPatch, sent: list[Sent]) -> None:
    job = approved_job(organization_make(), rows=1)
    job_start(job_id=job.pk)
    Chunk.objects.filter(job=job).update(deferrals=CHUNK_DEFERRALS)

    def outage(*args: object) -> None:
        raise EndpointConnectionError(endpoint_url="https://s3.example")

    monkeypatch.setattr("jobs.services.running.rows_read", outage)
    assert chunk_run(chunk_id=sent[-1].id) == ChunkStatus.PENDING
    assert Chunk.objects.get(job=job).attempts == 1


def test_a_rows_own_failure_spends_an_attempt(monkeypatch: pytest.MonkeyPatch,
                                              sent: list[Sent]) -> None:
    job = approved_job(organization_make(), rows=1)
    job_start(job_id=job.pk)

    def broken(*args: object) -> None:
        raise ValueError("not the infrastructure")

    monkeypatch.setattr("jobs.services.running.execute", broken)
    assert chunk_run(chunk_id=sent[-1].id) == ChunkStatus.PENDING
    chunk = Chunk.objects.get(job=job)
    assert (chunk.attempts, chunk.deferrals) == (1, 0)


def test_a_dead_engine_opens_the_breaker_and_the_worker_stops_taking_chunks(
        monkeypatch: pytest.MonkeyPatch, sent: list[Sent]) -> None:
    # Two organizations' jobs on one model; this worker's engine is dead.
    jobs = [approved_job(organization_make(), rows=2) for _ in range(2)]
    for job in jobs:
        job_start(job_id=job.pk)

    def dead(*args: object) -> None:
        raise EngineDeadError("EngineCore encountered an issue")

    monkeypatch.setattr("jobs.services.running.execute", dead)
    for message in list(sent)[:3]:
        assert chunk_run(chunk_id=message.id) == ChunkStatus.PENDING
    assert breakers_open() == [MODEL]
    # The next chunk is handed back unclaimed, for a worker whose engine answers.
    taken = Chunk.objects.filter(job__in=jobs, attempts__gt=0).count()
    resent_before = len(sent)
    untouched = next(c for c in Chunk.objects.filter(job__in=jobs, deferrals=0))
    assert chunk_run(chunk_id=str(untouched.pk)) is None
    untouched.refresh_from_db()
    assert (untouched.status, untouched.attempts) == (ChunkStatus.PENDING, 0)
    assert len(sent) == resent_before + 1 and sent[-1].id == str(untouched.pk)
    assert sent[-1].delay_ms is not None and sent[-1].delay_ms >= 5_000
    # No chunk of either organization was charged an attempt for the dead engine.
    assert Chunk.objects.filter(job__in=jobs, attempts__gt=0).count() == taken == 0
