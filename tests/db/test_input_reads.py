"""Issue 42 item 2: the job walk reads a JSONL input whole once before its first row runs.

A sampled chat job walked from its upload to its first chunk's run, every read of its
input through the region's storage counted: the estimate's checks read it whole and record
where its chunks end and which rows the sample runs (jobs.validation.layout); the sample
reads those rows alone, the start plans from the record and checks the input's pin, and
the chunk reads its own byte range. Before, the estimate's sample pick and the start's plan
read the whole input again. Through the real services, database and storage; only the
engine is replaced (this tier has no vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from inference.engines import ChatOutcome, ChatSettings
from inference.kinds.chat import ChatKind
from jobs.constants import ChunkStatus, JobStatus, JobSubstate
from jobs.models import Chunk, ChunkPlan, Job
from jobs.services.estimation import job_estimate
from jobs.services.inputs import SNIFF_BYTES
from jobs.services.rows import rows_read
from jobs.services.running import chunk_run, chunks_plan, job_start
from jobs.services.sampling import SAMPLE_ROWS, job_sample
from jobs.storage import LocalRegionStorage
from tests.db.test_fair_dispatch import answer
from tests.dispatched import dispatch_catch
from tests.factories import input_ready

pytestmark = pytest.mark.django_db(transaction=True)
JOBS = "/batch/v1/jobs"
MODEL = "gemma4-12b"  # a chat model: no max_output_tokens, so the job is priced by a sample
ROWS = 1000
CHUNK_ROWS = 100


@pytest.fixture(autouse=True)
def setup(settings: Settings, checkpoints: Path) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_SAMPLE_TOKENS_PER_HOUR = 10_000_000
    settings.ANEX_CHUNK_ROWS = CHUNK_ROWS


def lines(count: int) -> bytes:
    # Blank lines ending the file are let be, and are no rows.
    return b"".join(json.dumps({
        "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": f"Say hello to {i}. " * (1 + i % 9)}]}}
    ).encode() + b"\n" for i in range(count)) + b"\n \n"


class Reads:
    """Every read of one object through the local region storage, by kind: a whole read
    (`open`: a stream from the first byte), a range and its bytes, the head the format
    check sniffs, and the pin (`fingerprint`: the local store hashes the object to name
    its bytes; S3 answers it with a HEAD)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.key = ""
        self.seen: list[tuple[str, int]] = []
        cls = LocalRegionStorage
        opened, ranged, head, pinned = cls.open, cls.read_range, cls.read_head, cls.fingerprint

        def counted_open(storage: LocalRegionStorage, key: str, **kwargs: Any) -> Any:
            self._saw(key, "whole", 0)
            return opened(storage, key, **kwargs)

        def counted_range(storage: LocalRegionStorage, key: str, start: int, end: int,
                          **kwargs: Any) -> bytes:
            self._saw(key, "range", end - start)
            return ranged(storage, key, start, end, **kwargs)

        def counted_head(storage: LocalRegionStorage, key: str, length: int) -> bytes:
            self._saw(key, "head", length)
            return head(storage, key, length)

        def counted_pin(storage: LocalRegionStorage, key: str) -> tuple[int, str]:
            self._saw(key, "pin", 0)
            return pinned(storage, key)

        monkeypatch.setattr(cls, "open", counted_open)
        monkeypatch.setattr(cls, "read_range", counted_range)
        monkeypatch.setattr(cls, "read_head", counted_head)
        monkeypatch.setattr(cls, "fingerprint", counted_pin)

    def _saw(self, key: str, kind: str, size: int) -> None:
        if key.startswith("inputs/"):
            self.seen.append((kind, size))

    def take(self) -> list[tuple[str, int]]:
        seen, self.seen = self.seen, []
        return seen


class Engine:
    """The replaced engine: each sampled row answered in 7 tokens."""

    def generate(self, requests: list[Any], settings: ChatSettings) -> list[ChatOutcome]:
        return [ChatOutcome(content="ok", reasoning=None, finish_reason="stop",
                            prompt_tokens=5, completion_tokens=7, reasoning_tokens=0)
                for _ in requests]


def test_the_job_walk_reads_a_jsonl_input_whole_once_before_the_first_row(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch,
        sent: list[str]) -> None:
    dispatch_catch(monkeypatch, lambda message: None, "job_estimate_task",
                   "job_sample_task", "job_start_task")
    monkeypatch.setattr(ChatKind, "engine", lambda self, model_id: Engine())
    monkeypatch.setattr("jobs.services.running.execute", lambda job, rows: answer(rows))
    reads = Reads(monkeypatch)
    content = lines(ROWS)

    # Upload: the local store hashes it to pin it; the format check sniffs its head.
    item = input_ready(organization, content)
    assert sorted(reads.take()) == [("pin", 0), ("range", SNIFF_BYTES)]

    # Estimate: the checks read it whole, once, and record the chunks and the sample.
    response = api.post(JOBS, {"input_id": str(item.pk), "model": MODEL}, format="json")
    assert response.status_code == 200, response.json()
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
    assert reads.take() == [("whole", 0)]
    job.refresh_from_db()
    assert (job.substate, job.row_count) == (JobSubstate.SAMPLING, ROWS)
    picks = job.sample_rows or []
    assert len(picks) == SAMPLE_ROWS
    ends = ChunkPlan.objects.get(job=job).chunk_ends
    # ten full chunks, the last ending at the last row (the blank lines after it are no row's)
    assert len(ends) == ROWS // CHUNK_ROWS and ends[-1] == len(content) - len(b"\n \n")

    # Sample: the sampled rows alone, a range each.
    assert job_sample(job_id=job.pk) == JobStatus.COST_READY
    assert reads.take() == [("range", end - start) for _, start, end in picks]

    # Approve and start: the plan is the recorded one, and the pin is checked on one byte.
    assert api.post(f"{JOBS}/{job.pk}/approve").json()["status"] == "in_progress"
    assert job_start(job_id=job.pk) > 0
    assert reads.take() == [("range", 1)]
    chunks = list(Chunk.objects.filter(job=job).order_by("index"))
    assert [(c.first_row, c.row_count) for c in chunks] == \
        [(first, CHUNK_ROWS) for first in range(0, ROWS, CHUNK_ROWS)]
    # the same chunks the start would plan by reading the input (a job with no record)
    ChunkPlan.objects.filter(job=job).delete()
    read_plan = chunks_plan(Job.objects.select_related("input").get(pk=job.pk))
    assert [(c.first_row, c.row_count, c.byte_start, c.byte_end) for c in read_plan] == \
        [(c.first_row, c.row_count, c.byte_start, c.byte_end) for c in chunks]
    assert reads.take() == [("whole", 0)]  # (that read is this test's, not the walk's)

    # The first chunk runs on its own byte range.
    first = chunks[0]
    assert chunk_run(chunk_id=first.pk) == ChunkStatus.DONE
    assert reads.take() == [("range", (first.byte_end or 0) - (first.byte_start or 0))]


def test_rows_the_checks_pass_are_the_rows_the_run_reads(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch,
        sent: list[str]) -> None:
    # given a file the checks pass: a byte order mark, CRLF line ends, a \r between one
    # row's tokens (JSON whitespace), and blank lines ending it
    dispatch_catch(monkeypatch, lambda message: None, "job_estimate_task", "job_start_task")
    rows = [json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                        "body": {"input": f"row {i}"}}).encode() for i in range(5)]
    rows[3] = rows[3].replace(b'"method":', b'\r"method":')
    content = b"\xef\xbb\xbf" + b"\r\n".join(rows) + b"\r\n\r\n"
    item = input_ready(organization, content)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "qwen3-embedding-8b"},
                        format="json")
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    assert api.post(f"{JOBS}/{job.pk}/approve").json()["status"] == "in_progress"
    # when its chunks are planned and read as the run reads them
    assert job_start(job_id=job.pk) > 0
    job = Job.objects.select_related("input").get(pk=job.pk)
    read = [row for chunk in job.chunks.order_by("index") for row in rows_read(job, chunk)]
    # then every row the checks counted is read, the first and the fourth included
    assert [(row.index, row.ident) for row in read] == [(i, f"r{i}") for i in range(5)]
