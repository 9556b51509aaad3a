"""Jobs end to end on the real engines (tiny Qwen3, MiniLM), through the real broker and a
real Dramatiq worker: submit, estimate, approve, run, result file, one charge."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from billing.services import credits_summary
from console.models import Organization
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.services.running import chunk_run, job_finalize, job_start
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import api_key_make, input_ready, organization_make
from tests.workers import fresh_worker

pytestmark = pytest.mark.django_db(transaction=True)
JOBS = "/batch/v1/jobs"
SCHEMA = {"type": "json_schema", "json_schema": {"name": "greeting", "schema": {
    "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}


@pytest.fixture
def served(settings: Settings, checkpoint_dirs: dict[str, Path], live_server) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    settings.ANEX_CHECKPOINTS = {"tiny-qwen3": checkpoint_dirs["tiny-qwen3"],
                                 "all-minilm-l6-v2": checkpoint_dirs["minilm"],
                                 "laya": checkpoint_dirs["tiny-qwen3"]}
    settings.ANEX_WORKER_MODELS = sorted(settings.ANEX_CHECKPOINTS)
    settings.ANEX_CHUNK_ROWS = 2
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_API_ORIGIN = live_server.url  # result links served by the test server


@pytest.fixture
def worker(served: None) -> Iterator[Callable[..., None]]:
    with fresh_worker() as wait:
        yield wait


@pytest.fixture
def client(served: None) -> tuple[APIClient, Organization]:
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return api, organization


def chat_lines(*contents: str, **body: Any) -> bytes:
    return b"".join(json.dumps({"custom_id": f"row-{i}", "method": "POST",
                                "url": "/v1/chat/completions", "body": {
                                    "messages": [{"role": "user", "content": text}], **body}}
                               ).encode() + b"\n" for i, text in enumerate(contents))


def status(job_id: str) -> str:
    return Job.objects.get(pk=job_id).status


def run_to_done(api: APIClient, until: Callable[..., None], item_id: str,
                **fields: Any) -> dict[str, Any]:
    job_id = api.post(JOBS, {"input_id": item_id, **fields}, format="json").json()["id"]
    until(lambda: status(job_id) in ("cost_ready", "failed"))
    assert status(job_id) == "cost_ready", Job.objects.get(pk=job_id).failure_reason
    assert api.post(f"{JOBS}/{job_id}/approve").json()["status"] == "in_progress"
    until(lambda: status(job_id) in ("done", "failed", "cancelled"))
    body = api.get(f"{JOBS}/{job_id}").json()
    assert body["status"] == "done", body
    return body


def download(api: APIClient, job_id: str) -> bytes:
    result = api.get(f"{JOBS}/{job_id}/result").json()
    response = requests.get(result["result_url"], timeout=30)
    assert response.status_code == 200
    return response.content


def one_charge(organization: Organization, job_id: str) -> None:
    job = Job.objects.get(pk=job_id)
    kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds in (["charge", "hold", "release"], ["charge", "hold"])
    assert credits_summary(organization=organization).held == 0
    assert 1 <= (job.cost_cents or 0) <= (job.est_cost_cents or 0)


def test_a_chat_jsonl_job_runs_to_its_result_file(client, worker) -> None:  # type: ignore[no-untyped-def]
    api, organization = client
    item = input_ready(organization, chat_lines("Say hello.", "Count to three.", "Bye.",
                                                chat_template_kwargs={"enable_thinking": False}))
    body = run_to_done(api, worker, str(item.pk), model="tiny-qwen3", max_output_tokens=8,
                       reasoning=False)
    assert body["success_rows"] + body["truncated_rows"] == 3 and body["error_rows"] == 0
    lines = [json.loads(line) for line in download(api, body["id"]).splitlines()]
    assert [line["custom_id"] for line in lines] == ["row-0", "row-1", "row-2"]
    completion = lines[0]["response"]["body"]
    assert lines[0]["id"] == "batch_req_row-0" and lines[0]["error"] is None
    assert completion["choices"][0]["finish_reason"] in ("stop", "length")
    assert completion["usage"]["completion_tokens"] <= 8
    one_charge(organization, body["id"])


def test_structured_output_yields_json_or_counts_a_format_error(client, worker) -> None:  # type: ignore[no-untyped-def]
    api, organization = client
    item = input_ready(organization, chat_lines("Greet me.", "Greet them."))
    body = run_to_done(api, worker, str(item.pk), model="tiny-qwen3", max_output_tokens=64,
                       reasoning=False, response_format=SCHEMA)
    lines = [json.loads(line) for line in download(api, body["id"]).splitlines()]
    for line in lines:
        content = line["response"]["body"]["choices"][0]["message"]["content"]
        if line["error"] is None and line["response"]["body"]["choices"][0][
                "finish_reason"] == "stop":
            assert isinstance(json.loads(content)["word"], str)
    assert body["format_error_rows"] + body["success_rows"] + body["truncated_rows"] == 2


def test_thinking_with_a_budget_keeps_the_trace_out_of_the_content(client, worker) -> None:  # type: ignore[no-untyped-def]
    api, organization = client
    item = input_ready(organization, chat_lines("Think, then answer."))
    body = run_to_done(api, worker, str(item.pk), model="tiny-qwen3", max_output_tokens=96,
                       reasoning=True, reasoning_budget=16)
    (line,) = [json.loads(x) for x in download(api, body["id"]).splitlines()]
    message = line["response"]["body"]["choices"][0]["message"]
    assert "reasoning" in message and "<think>" not in (message["content"] or "")


def test_a_job_without_a_cap_is_priced_from_a_sample(client, worker) -> None:  # type: ignore[no-untyped-def]
    api, organization = client
    item = input_ready(organization, chat_lines("a", "b", "c", "d",
                                                chat_template_kwargs={"enable_thinking": False}))
    # A closed schema: the sample is generated under the job's own response_format.
    closed = {"type": "json_schema", "json_schema": {"name": "yes", "schema": {
        "type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
        "additionalProperties": False}}}
    job_id = api.post(JOBS, {"input_id": str(item.pk), "model": "tiny-qwen3",
                             "reasoning": False, "response_format": closed},
                      format="json").json()["id"]
    worker(lambda: status(job_id) in ("cost_ready", "failed"))
    job = Job.objects.get(pk=job_id)
    assert job.status == "cost_ready", job.failure_reason
    assert job.max_output_tokens and job.max_output_tokens < 64  # from the sample, not 1,024
    assert job.est_output_tok == 4 * job.max_output_tokens
    assert job.est_cost_cents and job.est_processing_seconds


def test_a_chat_job_with_only_the_model_set_is_estimated_and_done(client, worker,  # type: ignore[no-untyped-def]
                                                                  settings: Settings) -> None:
    # given a newcomer's first job: 50 rows, nothing but the model (thinking on, no cap,
    # no budget), so both caps come from a sample of the model's own answers
    settings.ANEX_CHUNK_ROWS = 25
    api, organization = client
    questions = ["Say hello in French.", "Name three colours.", "What is two plus two?",
                 "Is the invoice urgent?", "Summarize: we were billed twice for March.",
                 "Write a long story about a dragon.", "hi", "Was ist das?", "a", "Bye."]
    item = input_ready(organization, chat_lines(*(questions * 5)))
    job_id = api.post(JOBS, {"input_id": str(item.pk), "model": "tiny-qwen3"},
                      format="json").json()["id"]
    # when it is estimated
    worker(lambda: status(job_id) in ("cost_ready", "failed"))
    job = Job.objects.get(pk=job_id)
    # then from the sample, far below the catalog's 1,024-token maximum
    assert job.status == "cost_ready", job.failure_reason
    assert job.max_output_tokens_requested is None and job.reasoning_budget_requested is None
    assert job.reasoning_budget and job.max_output_tokens
    assert job.reasoning_budget < job.max_output_tokens <= 128
    assert job.est_output_tok == 50 * job.max_output_tokens
    assert job.est_cost_cents and job.est_processing_seconds
    # and approved, it runs to done with an answer on every row
    assert api.post(f"{JOBS}/{job_id}/approve").json()["status"] == "in_progress"
    worker(lambda: status(job_id) in ("done", "failed", "cancelled"))
    body = api.get(f"{JOBS}/{job_id}").json()
    assert body["status"] == "done", body
    assert body["success_rows"] == 50 and body["error_rows"] == body["truncated_rows"] == 0
    lines = [json.loads(line) for line in download(api, job_id).splitlines()]
    assert len(lines) == 50
    for line in lines:
        choice = line["response"]["body"]["choices"][0]
        assert choice["finish_reason"] == "stop"
        assert choice["message"]["content"].strip()
        assert choice["message"]["reasoning"].strip()
        usage = line["response"]["body"]["usage"]
        assert usage["completion_tokens"] <= job.max_output_tokens
    one_charge(organization, job_id)


def test_a_parquet_chat_job_keeps_its_columns(client, worker) -> None:  # type: ignore[no-untyped-def]
    import pyarrow as pa
    import pyarrow.parquet as pq

    api, organization = client
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": ["a", "b", "c"], "prompt": ["hi", "yo", "hey"],
                             "extra": [1, 2, 3]}), buffer)
    item = input_ready(organization, buffer.getvalue(), fmt="parquet")
    body = run_to_done(api, worker, str(item.pk), model="tiny-qwen3", max_output_tokens=8,
                       reasoning=False)
    table = pq.read_table(io.BytesIO(download(api, body["id"])))
    # The reference's columns, then what each row cost (docs/output-format.md).
    assert table.column_names == ["id", "prompt", "extra", "output", "error_type",
                                  "cost_credits"]
    assert table.column("id").to_pylist() == ["a", "b", "c"]


def test_an_embedding_job_returns_unit_vectors_at_the_asked_width(client, worker) -> None:  # type: ignore[no-untyped-def]
    api, organization = client
    rows = b"".join(json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": text}}).encode() + b"\n"
                    for i, text in enumerate(["a plain text string", "another one"]))
    item = input_ready(organization, rows)
    body = run_to_done(api, worker, str(item.pk), model="all-minilm-l6-v2", dimensions=64)
    for line in download(api, body["id"]).splitlines():
        vector = json.loads(line)["response"]["body"]["data"][0]["embedding"]
        assert len(vector) == 64
        assert math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, rel_tol=1e-3)
    one_charge(organization, body["id"])


def test_a_decision_job_answers_every_question(client, worker) -> None:  # type: ignore[no-untyped-def]
    api, organization = client
    row = {"custom_id": "t1", "method": "POST", "url": "/v1/systemone", "body": {
        "state": {"body": "We were billed twice for March."}, "questions": {
            "team": {"type": "choice", "instructions": "Which team?",
                     "criteria": {"billing": "payments", "other": "anything else"}},
            "urgent": {"type": "noul", "instructions": "Urgent?"}}}}
    item = input_ready(organization, json.dumps(row).encode() + b"\n")
    body = run_to_done(api, worker, str(item.pk), model="laya")
    (line,) = [json.loads(x) for x in download(api, body["id"]).splitlines()]
    answers = line["response"]["body"]["answers"]
    assert answers["team"]["choice"] in ("billing", "other")
    assert math.isclose(sum(answers["team"]["probabilities"].values()), 1.0, rel_tol=1e-3)
    assert 0.0 <= answers["urgent"]["noul"] <= 1.0
    assert line["response"]["body"]["usage"]["output_tokens"] == 0


def test_cancelling_mid_job_delivers_the_finished_rows(client, served) -> None:  # type: ignore[no-untyped-def]
    api, organization = client
    item = input_ready(organization, chat_lines("a", "b", "c", "d", "e", "f",
                                                chat_template_kwargs={"enable_thinking": False}))
    job = Job.objects.create(organization=organization, input=item, model="tiny-qwen3",
                             status=JobStatus.COST_READY, est_cost_cents=500, row_count=6,
                             max_output_tokens=8)
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    job_start(job_id=job.pk)
    first, *rest = list(Chunk.objects.filter(job=job).order_by("index"))
    Chunk.objects.filter(pk=first.pk).update(status=ChunkStatus.PENDING)
    assert chunk_run(chunk_id=first.pk) == ChunkStatus.DONE  # the real engine ran it
    assert api.post(f"{JOBS}/{job.pk}/cancel").json()["status"] == "cancelling"
    for chunk in rest:
        chunk_run(chunk_id=chunk.pk)
    job_finalize(job_id=job.pk)
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert (body["status"], body["partial"], body["pending_rows"]) == ("cancelled", True, 4)
    assert len(download(api, str(job.pk)).splitlines()) == 2
    one_charge(organization, str(job.pk))
