"""Issue 43, the jobs side: a JSONL job whose rows share work is planned grouped by its
estimate (jobs.validation.grouping) and run grouped, and everything it delivers is still
in file order, row for row.

Through the real services, database, storage and chunk path (jobs.services.running
chunk_run: the chunk's spans read, the kind's serve, its results object); only the engine
is replaced (this tier has no vLLM): it answers each row from its own prompt, so an
answer says which row it belongs to. The same file run with ANEX_GROUP_ROWS off is the
oracle. One test runs both on the real tiny-qwen3 engine (it takes the engine fixtures, so
it runs with the engine tier): greedy answers the same, row for row."""

from __future__ import annotations

import hashlib
import io
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from inference.constants import RowOutcome
from inference.engines import ChatOutcome, ChatSettings
from inference.kinds.chat import ChatKind
from inference.pricing import Usage
from jobs.constants import ChunkStatus, JobStatus
from jobs.jsonl import input_rows
from jobs.models import Chunk, ChunkPlan, Job
from jobs.results import records
from jobs.services.estimation import job_estimate
from jobs.services.rerun import job_rerun_input
from jobs.services.rows import rows_read
from jobs.services.running import chunk_run, job_finalize, job_start
from jobs.storage import LocalRegionStorage, StorageChanged, storage_for
from jobs.validation.grouping import plan_arrays
from tests.chunks import chunk_done, row_record
from tests.db.test_storage import s3, s3_endpoint  # noqa: F401
from tests.dispatched import dispatch_catch
from tests.factories import input_ready

pytestmark = pytest.mark.django_db(transaction=True)
JOBS = "/batch/v1/jobs"
MODEL = "gemma4-12b"
CHUNK_ROWS = 16
SYSTEM = "You answer questions about the document you are given, briefly."


@pytest.fixture(autouse=True)
def setup(settings: Settings, checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = CHUNK_ROWS
    settings.ANEX_GROUP_ROWS = True
    # The tests run every step themselves: nothing is sent.
    dispatch_catch(monkeypatch, lambda message: None, "job_estimate_task", "job_start_task",
                   "chunk_run_task", "job_finalize_task", "job_rerun_input_task")


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ChatKind, "engine", lambda self, model_id: Engine())


class Engine:
    """The replaced engine: a row's answer is a digest of its last message, so the answer
    names its row's prompt; it reads as many tokens as the prompt has words."""

    def generate(self, rows: list[Any], settings: ChatSettings) -> list[ChatOutcome]:
        outcomes = []
        for row in rows:
            text = row.messages[-1]["content"]
            outcomes.append(ChatOutcome(
                content=hashlib.sha256(text.encode()).hexdigest()[:16], reasoning=None,
                finish_reason="stop", prompt_tokens=sum(len(str(m["content"]).split())
                                                        for m in row.messages),
                completion_tokens=3, reasoning_tokens=0))
        return outcomes


def document(number: int, words: int = 300) -> str:
    return " ".join(f"doc{number}-w{k}" for k in range(words))


def documents_file(seed: int = 43, documents: int = 20, words: int = 300,
                   ) -> tuple[bytes, list[int]]:
    """`documents` documents asked 5 questions each, the rows interleaved at random; and
    each row's document."""
    rng = random.Random(seed)
    pairs = [(d, q) for d in range(documents) for q in range(5)]
    rng.shuffle(pairs)
    lines = [json.dumps({"custom_id": f"r{i}", "method": "POST",
                         "url": "/v1/chat/completions",
                         "body": {"messages": [
                             {"role": "system", "content": SYSTEM},
                             {"role": "user", "content": f"{document(d, words)}\n\nQuestion {q}: "
                                                         f"what does row {i} ask?"}]}}).encode()
             for i, (d, q) in enumerate(pairs)]
    return b"\n".join(lines) + b"\n", [d for d, _ in pairs]


def submitted(api: APIClient, organization: Organization, content: bytes,
              model: str = MODEL, **fields: Any) -> Job:
    """A job on `content`, estimated (its max_output_tokens priced it without a sample)."""
    item = input_ready(organization, content)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": model,
                               "max_output_tokens": 16, **fields}, format="json")
    assert response.status_code == 200, response.json()
    assert job_estimate(job_id=response.json()["id"]) == JobStatus.COST_READY
    return Job.objects.get(pk=response.json()["id"])


def started(api: APIClient, job: Job) -> list[Chunk]:
    assert api.post(f"{JOBS}/{job.pk}/approve").json()["status"] == "in_progress"
    job_start(job_id=job.pk)
    return list(Chunk.objects.filter(job=job).order_by("index"))


def finished(job: Job, chunks: list[Chunk]) -> Job:
    for chunk in chunks:
        chunk_run(chunk_id=chunk.pk)
    job_finalize(job_id=job.pk)
    return Job.objects.select_related("input").get(pk=job.pk)


def result_lines(job: Job) -> list[dict[str, Any]]:
    storage = storage_for(job.data_residency)
    assert isinstance(storage, LocalRegionStorage)
    return [json.loads(line) for line in storage.path(job.result_key).read_bytes().splitlines()]


def answered(line: dict[str, Any]) -> tuple[Any, ...]:
    """What a result line says of its row, less what names its job (the completion's id,
    its time) and what the engine's prefix cache held when it ran (cached_tokens: one
    engine serves both jobs, the second finding the first's prefixes)."""
    body = line["response"]["body"]
    usage = {key: value for key, value in body["usage"].items()
             if key != "prompt_tokens_details"}
    return (line["custom_id"], line["response"]["status_code"],
            body["choices"][0]["message"]["content"], usage, line["error"], line["cost"])


def test_documents_questions_interleaved_at_random_are_planned_and_run_together(
        api: APIClient, organization: Organization, fake: None) -> None:
    # given 20 documents x 5 questions, interleaved at random in the file
    content, docs = documents_file()
    job = submitted(api, organization, content)
    # the estimate states what the rows share
    assert job.est_identical_rows == 0
    assert job.est_shared_prefix_share is not None and 0.4 < job.est_shared_prefix_share < 0.9
    shown = api.get(f"{JOBS}/{job.pk}").json()
    assert shown["est_identical_rows"] == 0
    assert shown["est_shared_prefix_share"] == pytest.approx(job.est_shared_prefix_share)
    assert shown["cached_input_tok"] == 0
    # and keeps a grouped plan: every row once, each document's rows consecutive
    plan = ChunkPlan.objects.get(job=job)
    assert plan.row_order is not None and plan.row_starts is not None
    order, _starts = plan_arrays(bytes(plan.row_order), bytes(plan.row_starts))
    assert sorted(order.tolist()) == list(range(100))
    planned = [docs[i] for i in order.tolist()]
    assert all(len(set(planned[at:at + 5])) == 1 for at in range(0, 100, 5))

    # when it starts: chunks of 16 consecutive planned rows, each naming its rows' bytes
    chunks = started(api, job)
    assert [(c.first_row, c.row_count) for c in chunks] == \
        [(first, min(CHUNK_ROWS, 100 - first)) for first in range(0, 100, CHUNK_ROWS)]
    spans = [c.spans for c in chunks]
    assert all(span is not None and len(span) == 3 * c.row_count
               for span, c in zip(spans, chunks, strict=True))
    flat = np.array([value for span in spans for value in span or []]).reshape(-1, 3)
    assert flat[:, 0].tolist() == order.tolist()
    read = [(start, end) for start, end, _line in input_rows(io.BytesIO(content))]
    assert [(int(s), int(e)) for _, s, e in flat[np.argsort(flat[:, 0])]] == read
    # a chunk reads its own rows, in planned order, each with its own index
    job = Job.objects.select_related("input").get(pk=job.pk)
    first = rows_read(job, chunks[0])
    assert [row.index for row in first] == order[:CHUNK_ROWS].tolist()
    assert [row.ident for row in first] == [f"r{i}" for i in order[:CHUNK_ROWS].tolist()]

    # then, run, its result is in file order, row for row
    done = finished(job, chunks)
    assert done.status == JobStatus.DONE and done.success_rows == 100
    grouped_lines = result_lines(done)
    assert [line["custom_id"] for line in grouped_lines] == [f"r{i}" for i in range(100)]

    # and is the result the same file gives run contiguously
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("django.conf.settings.ANEX_GROUP_ROWS", False)
        plain = submitted(api, organization, content)
        assert ChunkPlan.objects.get(job=plain).row_order is None
        assert plain.est_shared_prefix_share is None and plain.est_identical_rows is None
        plain_chunks = started(api, plain)
        assert all(c.spans is None for c in plain_chunks)
        plain = finished(plain, plain_chunks)
    assert plain.cost_cents == done.cost_cents
    assert [answered(line) for line in result_lines(plain)] == \
        [answered(line) for line in grouped_lines]


def test_identical_rows_are_planned_side_by_side(
        api: APIClient, organization: Organization, fake: None) -> None:
    # given 40 distinct short rows, then 20 that repeat some of them but for custom_id
    texts = [f"Translate to French: sentence number {i}." for i in range(40)]
    repeats = [3, 17, 3, 25, 17, 3, 8, 8, 30, 3, 12, 25, 17, 39, 0, 0, 3, 21, 22, 8]
    lines = [json.dumps({"custom_id": f"c{i}", "method": "POST",
                         "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user", "content": text}]}}).encode()
             for i, text in enumerate([*texts, *(texts[r] for r in repeats)])]
    job = submitted(api, organization, b"\n".join(lines) + b"\n")
    assert job.est_identical_rows == 20
    plan = ChunkPlan.objects.get(job=job)
    assert plan.row_order is not None
    order = np.frombuffer(bytes(plan.row_order), "<u4").tolist()
    for first in {*repeats}:
        copies = [40 + at for at, repeated in enumerate(repeats) if repeated == first]
        place = order.index(first)
        assert order[place:place + 1 + len(copies)] == [first, *copies]
    # every copy gets its own line, with its own custom_id and the same answer
    done = finished(job, started(api, job))
    result = result_lines(done)
    assert [line["custom_id"] for line in result] == [f"c{i}" for i in range(60)]
    answers = [line["response"]["body"]["choices"][0]["message"]["content"] for line in result]
    assert all(answers[40 + at] == answers[r] for at, r in enumerate(repeats))


def test_a_file_sharing_nothing_keeps_a_contiguous_plan(
        api: APIClient, organization: Organization) -> None:
    lines = [json.dumps({"custom_id": f"u{i}", "method": "POST",
                         "url": "/v1/chat/completions",
                         "body": {"messages": [{"role": "user",
                                                "content": f"{i}: " + document(i)}]}}).encode()
             for i in range(50)]
    job = submitted(api, organization, b"\n".join(lines) + b"\n")
    assert ChunkPlan.objects.get(job=job).row_order is None
    assert job.est_identical_rows == 0 and job.est_shared_prefix_share == 0
    chunks = started(api, job)
    assert all(c.spans is None and c.byte_start is not None for c in chunks)


def test_a_cancelled_grouped_job_delivers_its_finished_rows_in_file_order(
        api: APIClient, organization: Organization, fake: None) -> None:
    content, _ = documents_file(seed=5)
    job = submitted(api, organization, content)
    chunks = started(api, job)
    assert chunks[0].spans is not None
    # two chunks run, then the job is cancelled: the rest are skipped
    for chunk in chunks[:2]:
        assert chunk_run(chunk_id=chunk.pk) == ChunkStatus.DONE
    assert api.post(f"{JOBS}/{job.pk}/cancel").status_code == 200
    for chunk in chunks[2:]:
        chunk_run(chunk_id=chunk.pk)
    job_finalize(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED and job.partial
    ran = sorted(value for chunk in chunks[:2] for value in (chunk.spans or [])[0::3])
    assert [line["custom_id"] for line in result_lines(job)] == [f"r{i}" for i in ran]
    # the records a re-run reads are in file order too
    done = list(job.chunks.filter(status=ChunkStatus.DONE).order_by("index"))
    assert [row["i"] for row in records(job, done)] == ran


def outcome_of(index: int) -> RowOutcome:
    return RowOutcome.ERROR if index % 7 == 3 else RowOutcome.SUCCESS


def run_as_recorded(job: Job, chunks: list[Chunk], outcome: Callable[[int], RowOutcome],
                    tag: str) -> Job:
    """Each chunk run as chunk_run ends one, its rows read by the chunk's own read (a
    grouped chunk's in planned order) and answered `tag` with the given outcome."""
    job = Job.objects.select_related("input").get(pk=job.pk)
    for chunk in chunks:
        chunk_done(chunk, [row_record(row.index, row.ident, outcome(row.index),
                                      Usage(input_tokens=100 + row.index, output_tokens=10),
                                      answer=f"{tag}:{row.ident}")
                           for row in rows_read(job, chunk)])
    job_finalize(job_id=job.pk)
    return Job.objects.select_related("input").get(pk=job.pk)


def test_a_rerun_of_a_grouped_job_takes_its_failed_rows_in_file_order(
        api: APIClient, organization: Organization) -> None:
    # given a grouped job whose every 7th row (from the 4th) failed
    content, _ = documents_file(seed=11)
    job = submitted(api, organization, content)
    chunks = started(api, job)
    assert chunks[0].spans is not None
    parent = run_as_recorded(job, chunks, outcome_of, "parent")
    failed = [i for i in range(100) if outcome_of(i) == RowOutcome.ERROR]
    assert parent.error_rows == len(failed)
    # when its failed rows are run again
    response = api.post(f"{JOBS}/{parent.pk}/rerun", None, format="json")
    assert response.status_code == 200, response.content
    child_item = job_rerun_input(job_id=response.json()["id"])
    # then the re-run's input is those rows, in file order, byte for byte
    assert child_item is not None
    storage = storage_for("world")
    assert isinstance(storage, LocalRegionStorage)
    lines = content.splitlines(keepends=True)
    assert storage.path(child_item.object_key).read_bytes() == \
        b"".join(lines[i] for i in failed)
    # and, once it has run, the merged result is every row once, in file order
    child = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=child.pk) == JobStatus.COST_READY
    child_chunks = started(api, child)
    run_as_recorded(child, child_chunks, lambda index: RowOutcome.SUCCESS, "child")
    merged = api.get(f"{JOBS}/{parent.pk}/result", {"merged": "true"})
    assert merged.status_code == 200, merged.content
    from jobs.services.purge import merged_key
    rows = [json.loads(line) for line in storage.path(merged_key(parent)).read_bytes()
            .splitlines()]
    assert [row["custom_id"] for row in rows] == [f"r{i}" for i in range(100)]
    contents = [row["response"]["body"]["choices"][0]["message"]["content"] for row in rows]
    assert contents == [f"child:r{i}" if i in failed else f"parent:r{i}" for i in range(100)]


def test_a_grouped_job_answers_as_a_contiguous_one_on_the_real_engine(
        api: APIClient, organization: Organization, settings: Settings,
        checkpoint_dirs: dict[str, Path]) -> None:
    # given 4 documents x 5 questions interleaved, on the real (greedy) engine
    settings.ANEX_CHECKPOINTS = {**settings.ANEX_CHECKPOINTS,
                                 "tiny-qwen3": checkpoint_dirs["tiny-qwen3"]}
    settings.ANEX_CHUNK_ROWS = 8
    content, docs = documents_file(seed=3, documents=4, words=60)
    grouped_job = submitted(api, organization, content, model="tiny-qwen3", reasoning=False)
    plan = ChunkPlan.objects.get(job=grouped_job)
    assert plan.row_order is not None
    order = np.frombuffer(bytes(plan.row_order), "<u4").tolist()
    assert all(len({docs[i] for i in order[at:at + 5]}) == 1 for at in range(0, 20, 5))
    grouped_job = finished(grouped_job, started(api, grouped_job))
    # when the same file runs with grouping off
    settings.ANEX_GROUP_ROWS = False
    plain = submitted(api, organization, content, model="tiny-qwen3", reasoning=False)
    plain_chunks = started(api, plain)
    assert all(c.spans is None for c in plain_chunks)
    plain = finished(plain, plain_chunks)
    # then both are in file order, row for row the same answers and usage
    assert (grouped_job.status, plain.status) == (JobStatus.DONE, JobStatus.DONE)
    grouped_lines, plain_lines = result_lines(grouped_job), result_lines(plain)
    assert [line["custom_id"] for line in grouped_lines] == [f"r{i}" for i in range(20)]
    assert [answered(line) for line in grouped_lines] == \
        [answered(line) for line in plain_lines]


def test_a_job_reports_its_cached_input_tokens_from_its_recorded_usage(
        api: APIClient, organization: Organization, fake: None) -> None:
    content, _ = documents_file(seed=2, documents=4)
    job = submitted(api, organization, content)
    finished(job, started(api, job))
    # the usage a job recorded when it ended, with the engine's cached tokens summed in
    # (inference.pricing.Usage.cached_input_tokens), and one recorded before they were
    for usage, shown in (({"input_tokens": 900, "cached_input_tokens": 640}, 640),
                         ({"input_tokens": 900}, 0)):
        Job.objects.filter(pk=job.pk).update(usage=usage)
        assert api.get(f"{JOBS}/{job.pk}").json()["cached_input_tok"] == shown


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> str:
    """The storage backend the input is read from: the local one, or moto's S3."""
    if request.param == "s3":
        request.getfixturevalue("s3")
    return str(request.param)


def test_a_grouped_chunk_reads_its_rows_apart_on_threads_pinned(
        api: APIClient, organization: Organization, backend: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given a grouped job on either backend, and no gap read through: each run of rows
    # that are neighbours in the file is a read of its own, made on the span readers
    monkeypatch.setattr("jobs.services.rows.SPAN_GAP_BYTES", 0)
    content, _ = documents_file(seed=9, documents=6)
    job = submitted(api, organization, content)
    chunks = started(api, job)
    job = Job.objects.select_related("input").get(pk=job.pk)
    lines = content.splitlines()
    for chunk in chunks:
        planned = (chunk.spans or [])[0::3]
        # when its rows are read: every one, in planned order, its own bytes
        rows = rows_read(job, chunk)
        assert [row.index for row in rows] == planned
        assert [row.ident for row in rows] == [json.loads(lines[i])["custom_id"]
                                               for i in planned]
        assert [row.body for row in rows] == [json.loads(lines[i])["body"] for i in planned]
    # and a file swapped under its key since is refused, never read
    assert job.input is not None
    storage_for(job.data_residency).write_stream(
        job.input.object_key, iter([content.replace(b"doc", b"DOC")]), max_bytes=10**8)
    with pytest.raises(StorageChanged):
        rows_read(job, chunks[0])
