"""Logs that follow a job (issue 24 item 3;
docs/dev/decisions/2026-12-02-logs-that-follow-a-job.md): the request id of POST /jobs travels in
the messages it causes, through the real Redis broker and an in-process Dramatiq worker, to the
estimate, the chunk and the webhook deliveries' lines, each one JSON object with request_id and
job_id; an exception's message (which may quote a row) is never written. Only the engine step
is replaced (this tier has no vLLM)."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings

from anex.logcontext import JobLogFilter, JsonFormatter, log_context
from anex.requestid import REQUEST_ID_HEADER, RequestIdLogFilter
from console.selectors import organization_webhook_secret
from jobs.constants import DeliveryStatus, JobStatus
from jobs.models import Chunk, Job, WebhookDelivery
from jobs.services.webhook_endpoint import organization_webhook_set
from tests.db.test_fair_dispatch import answer
from tests.db.test_webhooks import answering, hooks, receiver, verified  # noqa: F401
from tests.factories import SYSTEM, api_key_make, input_ready, organization_make
from tests.servers import LocalServer
from tests.workers import fresh_worker

MODEL = "qwen3-embedding-8b"
ROW_TEXT = "the customer's secret row text"


@pytest.fixture
def json_log() -> Iterator[Callable[[], list[dict[str, Any]]]]:
    """Every line logged meanwhile, as the JSON handler of settings.LOGGING writes it
    (ANEX_LOG_FORMAT=json): its filters and its formatter."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(RequestIdLogFilter())
    handler.addFilter(JobLogFilter())
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.INFO)
    root.addHandler(handler)
    try:
        # Every line must be one JSON object: json.loads fails the test otherwise.
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@pytest.mark.django_db(transaction=True)
def test_one_request_id_follows_a_job_from_submit_to_its_webhooks(
        settings: Settings, checkpoints: Path, client_for: Callable[..., Any],
        receiver: LocalServer, monkeypatch: pytest.MonkeyPatch,  # noqa: F811
        json_log: Callable[[], list[dict[str, Any]]]) -> None:
    settings.ANEX_WORKER_MODELS = [MODEL]
    settings.ANEX_WORKER_REGIONS = ["world"]
    settings.ANEX_CHUNK_ROWS = 1
    monkeypatch.setattr("jobs.services.running.execute", lambda job, rows: answer(rows))
    answering(receiver)
    organization = organization_webhook_set(organization=organization_make(auto_approve=True),
                                            actor=SYSTEM, url=receiver.url("/hook"))
    secret = organization_webhook_secret(organization=organization)
    assert secret is not None
    _key, plaintext = api_key_make(organization)
    rows = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": f"{ROW_TEXT} {i}"}}).encode() + b"\n"
                    for i in range(2))
    item = input_ready(organization, rows)

    with fresh_worker(threads=1) as until:
        response = client_for(plaintext).post("/batch/v1/jobs", {
            "input_id": str(item.pk), "model": MODEL}, format="json")
        assert response.status_code == 200, response.content
        request_id = response[REQUEST_ID_HEADER]
        job_id = response.json()["id"]
        until(lambda: Job.objects.get(pk=job_id).status == JobStatus.DONE and not
              WebhookDelivery.objects.filter(job_id=job_id,
                                             status=DeliveryStatus.PENDING).exists(),
              timeout=120)

    events = [verified(seen, secret)["type"] for seen in hooks(receiver)]
    assert events == ["submitted", "estimating", "cost_ready", "in_progress", "completed"]
    lines = json_log()
    about_job = [line for line in lines if line["job_id"] == job_id]
    # Every line about the job, in the web tier and the worker, names the one request.
    assert about_job and {line["request_id"] for line in about_job} == {request_id}
    messages = [line["message"] for line in about_job]
    assert f"estimate {job_id} finished in" in " ".join(messages)
    chunk_ids = {str(pk) for pk in Chunk.objects.filter(job_id=job_id).values_list(
        "pk", flat=True)}
    chunk_lines = [line for line in about_job if line["chunk_id"] in chunk_ids]
    assert {line["chunk_id"] for line in chunk_lines} == chunk_ids
    assert any(line["message"].endswith(": done") for line in chunk_lines)
    deliveries = {str(pk) for pk in WebhookDelivery.objects.filter(job_id=job_id).values_list(
        "pk", flat=True)}
    delivered = [line for line in about_job if line["message"].startswith("delivery ")
                 and line["message"].endswith(": delivered")]
    assert {line["message"].split()[1] for line in delivered} == deliveries
    assert all(set(line) >= {"time", "level", "logger", "message", "request_id", "job_id"}
               for line in lines)
    assert ROW_TEXT not in "\n".join(json.dumps(line) for line in lines)


def test_an_exception_is_written_by_class_and_frames_never_its_message(
        json_log: Callable[[], list[dict[str, Any]]]) -> None:
    logger = logging.getLogger("jobs.services.running")
    with log_context(job_id="job-1", chunk_id="chunk-1", request_id="req_abc"):
        try:
            try:
                raise ValueError(f"row 3 has {ROW_TEXT}")
            except ValueError as cause:
                raise RuntimeError(f"tokenizer refused {ROW_TEXT}") from cause
        except RuntimeError:
            logger.exception("chunk %s of job %s failed", 0, "job-1")
    (line,) = json_log()
    assert (line["request_id"], line["job_id"], line["chunk_id"]) == ("req_abc", "job-1",
                                                                      "chunk-1")
    assert line["exception"]["type"] == "builtins.RuntimeError"
    assert line["exception"]["causes"] == ["ValueError"]
    assert any("test_job_logs.py" in frame for frame in line["exception"]["frames"])
    assert ROW_TEXT not in json.dumps(line)


def test_the_setting_selects_json_lines_and_plain_stays_the_default() -> None:
    """ANEX_LOG_FORMAT read by anex.settings and its LOGGING applied as Django applies it,
    in a process of its own (logging's configuration is process-wide); settings only, no
    app loaded, to keep it cheap."""
    script = """
import importlib, logging, logging.config, os
os.environ["ANEX_LOG_FORMAT"] = "json"
import anex.settings as settings
for _ in range(2):
    logging.config.dictConfig(settings.LOGGING)
    logging.getLogger("jobs").warning("one line about %s", "x")
    os.environ.pop("ANEX_LOG_FORMAT", None)
    settings = importlib.reload(settings)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, env=os.environ.copy(), check=True)
    json_line, plain = done.stderr.strip().splitlines()[-2:]
    line = json.loads(json_line)
    assert (line["message"], line["level"], line["request_id"], line["job_id"]) == (
        "one line about x", "WARNING", None, None)
    assert plain.endswith("WARNING jobs [-] one line about x")
