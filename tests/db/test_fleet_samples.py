"""Issue 21, item 2: a sampled estimate reads only the rows it samples (picked where the
estimate read the input, so the GPU worker never reads the whole file again), and it never
waits behind paid chunks: its queue has its own consumer on the model's workers, and of
the messages a worker holds it runs first.

Through the real PostgreSQL, Redis broker and Dramatiq worker; only the engine is replaced
(this tier has no vLLM), by an answer per row that records when it ran."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from inference.engines import ChatOutcome, ChatSettings
from inference.kinds.base import InputRow
from inference.kinds.chat import ChatKind
from inference.pricing import Usage
from jobs import dispatch
from jobs.constants import JobStatus, JobSubstate
from jobs.dispatch import run_queues_declare, sample_queue
from jobs.models import Job
from jobs.services import sampling
from jobs.services.estimation import job_estimate
from jobs.services.running import job_start
from jobs.services.sampling import SAMPLE_ROWS, job_sample, sample_allowance
from jobs.storage import LocalRegionStorage
from tests.db.test_fair_dispatch import answer, approved_job
from tests.dispatched import Sent, dispatch_catch
from tests.factories import input_ready, organization_make
from tests.workers import broker_flush, running_worker, until

MODEL = "gemma4-12b"
ROWS = 500


@pytest.fixture(autouse=True)
def setup(settings: Settings, checkpoints: Path) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_SAMPLE_TOKENS_PER_HOUR = 10_000_000


class Engine:
    """The replaced engine: each row answered in 7 tokens, its custom text kept."""

    def __init__(self, ran: list[str] | None = None) -> None:
        self.seen: list[Any] = []
        self.ran = ran

    def generate(self, requests: list[Any], settings: ChatSettings) -> list[ChatOutcome]:
        if self.ran is not None:
            self.ran.append("sample")
        self.seen += requests
        return [ChatOutcome(content="ok", reasoning=None, finish_reason="stop",
                            prompt_tokens=5, completion_tokens=7, reasoning_tokens=0)
                for _ in requests]


def lines(count: int) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": f"Say hello to {i}. " * 20}]}}
    ).encode() + b"\n" for i in range(count))


def sampling_job(api: APIClient, organization: Organization, rows: int) -> Job:
    """A chat job with no max_output_tokens, estimated (rows checked and counted): it
    waits for its sample."""
    item = input_ready(organization, lines(rows))
    response = api.post("/batch/v1/jobs", {"input_id": str(item.pk), "model": MODEL},
                        format="json")
    assert response.status_code == 200, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
    job.refresh_from_db()
    assert job.substate == JobSubstate.SAMPLING
    return job


@pytest.mark.django_db
def test_the_sample_reads_only_the_rows_it_samples(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    dispatch_catch(monkeypatch, lambda message: None, "job_sample_task")
    job = sampling_job(api, organization, ROWS)
    # The estimate picked the sample where it read the input: 64 rows, each with its bytes.
    picks = job.sample_rows
    assert picks is not None and len(picks) == SAMPLE_ROWS
    assert len({index for index, _, _ in picks}) == SAMPLE_ROWS
    size = len(lines(ROWS))
    # The sample's worker: every read of the input counted.
    reads: list[tuple[str, int]] = []
    read_range, opened = LocalRegionStorage.read_range, LocalRegionStorage.open

    def counted_range(self: LocalRegionStorage, key: str, start: int, end: int,
                      **kwargs: Any) -> bytes:
        reads.append(("range", end - start))
        return read_range(self, key, start, end, **kwargs)

    def counted_open(self: LocalRegionStorage, key: str, **kwargs: Any) -> Any:
        reads.append(("whole", size))
        return opened(self, key, **kwargs)

    monkeypatch.setattr(LocalRegionStorage, "read_range", counted_range)
    monkeypatch.setattr(LocalRegionStorage, "open", counted_open)
    engine = Engine()
    monkeypatch.setattr(ChatKind, "engine", lambda self, model_id: engine)
    assert job_sample(job_id=job.pk) == JobStatus.COST_READY
    # No whole read: one range per sampled row, about an eighth of the file here.
    assert [kind for kind, _ in reads] == ["range"] * SAMPLE_ROWS
    assert sum(n for _, n in reads) < size * SAMPLE_ROWS / ROWS * 1.1
    # And they are the picked rows, each the row its index names.
    texts = sorted(request.messages[0]["content"] for request in engine.seen)
    assert texts == sorted(f"Say hello to {index}. " * 20 for index, _, _ in picks)
    # The free allowance is still counted: what the sample used, 64 rows of 5 + 7 tokens.
    job.refresh_from_db()
    assert job.sample_tokens == SAMPLE_ROWS * 12
    assert sample_allowance(organization_id=organization.pk).used == SAMPLE_ROWS * 12


@pytest.mark.django_db
def test_a_small_file_is_sampled_whole(api: APIClient, organization: Organization,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    dispatch_catch(monkeypatch, lambda message: None, "job_sample_task")
    job = sampling_job(api, organization, 5)
    assert [index for index, _, _ in job.sample_rows or []] == [0, 1, 2, 3, 4]
    engine = Engine()
    monkeypatch.setattr(ChatKind, "engine", lambda self, model_id: engine)
    assert job_sample(job_id=job.pk) == JobStatus.COST_READY
    assert len(engine.seen) == 5


@pytest.mark.django_db
def test_a_parquet_inputs_sample_reads_its_rows_by_index(
        organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    dispatch_catch(monkeypatch, lambda message: None, "job_sample_task")
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(200)],
                             "prompt": [f"question {i}" for i in range(200)]}), buffer,
                   row_group_size=50)
    item = input_ready(organization, buffer.getvalue(), fmt="parquet")
    job = Job.objects.create(organization=organization, model=MODEL, input=item,
                             format="parquet", status=JobStatus.SUBMITTED)
    assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
    job.refresh_from_db()
    picks = job.sample_rows or []
    assert len(picks) == SAMPLE_ROWS and all(len(pick) == 1 for pick in picks)
    engine = Engine()
    monkeypatch.setattr(ChatKind, "engine", lambda self, model_id: engine)
    assert job_sample(job_id=job.pk) == JobStatus.COST_READY
    assert sorted(request.messages[-1]["content"] for request in engine.seen) == \
        sorted(f"question {index}" for (index,) in picks)


@pytest.mark.django_db(transaction=True)
def test_a_sample_runs_next_though_paid_chunks_are_queued(
        api: APIClient, organization: Organization, settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_WORKER_REGIONS = ["world"]
    settings.ANEX_WORKER_MODELS = [MODEL]
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_DISPATCH_IN_FLIGHT = settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 4
    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    broker_flush()
    run_queues_declare()
    send = dispatch.send
    held: list[Sent] = []
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")  # started here
    dispatch_catch(monkeypatch, held.append, "job_sample_task")
    ran: list[str] = []
    sample_taken = threading.Event()
    sample_key = f"{broker.namespace}:{sample_queue('world', MODEL)}"

    def chunk_step(job: Job, rows: list[InputRow]) -> tuple[list[dict[str, Any]], Usage]:
        if not ran:
            # While the worker's one thread runs its first chunk (the run queue's consumer
            # holding the next ones), the sample is sent; the sample queue's own consumer
            # takes it into the worker (its queue in Redis empties) before this chunk ends.
            message = held.pop()
            send(message.actor, *message.args, queue=message.queue)
            until(lambda: broker.client.llen(sample_key) == 0, timeout=30)
            sample_taken.set()
        ran.append("chunk")
        return answer(rows)

    monkeypatch.setattr("jobs.services.running.execute", chunk_step)
    monkeypatch.setattr(ChatKind, "engine", lambda self, model_id: Engine(ran))
    # An organization's paid job: four chunks queued in the model's run queue.
    paid = approved_job(organization_make(), rows=4)
    assert job_start(job_id=paid.pk) == 4
    # Another organization's job waits for its sample (sent once a chunk runs, above).
    job = sampling_job(api, organization, 3)
    assert len(held) == 1 and held[0].queue == sample_queue("world", MODEL)

    def done() -> bool:
        return Job.objects.filter(pk__in=[paid.pk, job.pk],
                                  status__in=[JobStatus.DONE, JobStatus.COST_READY]).count() == 2

    with running_worker(threads=1):
        until(done, timeout=120)
    assert sample_taken.is_set()
    # One thread: the chunk it was running, then the sample, then the rest of the chunks
    # (behind them, the sample would have waited for all four).
    assert ran == ["chunk", "sample"] + ["chunk"] * 3


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_one_sample_at_a_time_and_its_paid_chunks_meanwhile(
        api: APIClient, organization: Organization, settings: Settings,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 40, H2: samples go first and are free, so several at once held every thread
    of a model's worker (for as long as their rows generate, up to the output cap) while
    paid chunks waited. A worker now runs one sample at a time; the others go back to
    their queue for a moment, and its other threads take the chunks."""
    settings.ANEX_WORKER_REGIONS = ["world"]
    settings.ANEX_WORKER_MODELS = [MODEL]
    settings.ANEX_CHUNK_ROWS = 1
    settings.ANEX_DISPATCH_IN_FLIGHT = settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 4
    monkeypatch.setattr(sampling, "SAMPLE_WAIT_MS", 200)
    broker_flush()
    run_queues_declare()
    dispatch_catch(monkeypatch, lambda message: None, "job_start_task")  # started here
    lock = threading.Lock()
    running: list[str] = []
    peak = [0]
    sampling_started = threading.Event()
    chunk_ran = threading.Event()
    waits: list[bool] = []

    class SlowEngine(Engine):
        """A sample's rows generating until a paid chunk has run beside them (or 30 s)."""

        def generate(self, requests: list[Any], settings: ChatSettings) -> list[ChatOutcome]:
            with lock:
                running.append("sample")
                peak[0] = max(peak[0], len(running))
            sampling_started.set()
            waits.append(chunk_ran.wait(timeout=30))
            with lock:
                running.remove("sample")
            return super().generate(requests, settings)

    def chunk_step(job: Job, rows: list[InputRow]) -> tuple[list[dict[str, Any]], Usage]:
        chunk_ran.set()
        return answer(rows)

    monkeypatch.setattr("jobs.services.running.execute", chunk_step)
    monkeypatch.setattr(ChatKind, "engine", lambda self, model_id: SlowEngine())
    # given three samples queued (the hourly allowance has room for all), and a paid job
    samples = [sampling_job(api, organization, 3) for _ in range(3)]
    paid = approved_job(organization_make(), rows=2)

    def done() -> bool:
        return (Job.objects.filter(pk__in=[job.pk for job in samples],
                                   status=JobStatus.COST_READY).count() == 3
                and Job.objects.filter(pk=paid.pk, status=JobStatus.DONE).exists())

    # when a worker with three threads takes the samples, and the paid job's two chunks
    # come once the first sample runs
    with running_worker(threads=3):
        assert sampling_started.wait(timeout=60)
        assert job_start(job_id=paid.pk) == 2
        until(done, timeout=120)
    # then never two samples ran at once (the others went back to their queue, leaving
    # the threads free), and the chunks ran while the first sample did: its rows waited
    # for a chunk, and not in vain
    assert peak[0] == 1
    assert len(waits) == 3 and all(waits)
