"""Issue 11, item 13: a job's media (per image, per clip, per minute, and the tokens they
encode to at the media rate) are in the final charge as they are in the estimate, on the
sampled path too. The rows run through the real pipeline (estimate, approve, plan, each
chunk's execute with its media brought from a local HTTPS host, finalize) with only the
engine faked: it reports, per row, the prompt tokens the estimate counted. The hosted
clips are a few seconds long and declare longer: a declared length is what is billed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from billing.services import Credits, credits_summary
from console.models import Organization
from inference.catalog import model_get
from inference.engines import ChatOutcome, ChatRow, ChatSettings, EmbedOutcome, EmbedRow
from inference.kinds.base import InputRow
from inference.pricing import Usage, price, usage_from_json
from jobs.constants import JobStatus
from jobs.models import Chunk, Job
from jobs.services.estimation import job_estimate
from jobs.services.running import chunk_run, execute, job_start
from jobs.services.sampling import SampleResult, job_sample
from tests.dispatched import dispatch_catch, finalizes_run
from tests.factories import input_ready
from tests.media import clip, picture, tone
from tests.servers import LocalServer, reply, tls_context

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
ROWS = 100
OUTPUT = 10
# On gemma4-12b (fixed 1 fps): a 60 s video is 61 frames of 256 tokens, 30 s of audio 750
# tokens, an image 256; two clips and a minute and a half a row.
MEDIA_TOKENS = 61 * 256 + 30 * 25 + 256
ROW_MEDIA = Usage(media_tokens=MEDIA_TOKENS, images=1, clips=2, media_seconds=Decimal(90))


@pytest.fixture(autouse=True)
def setup(settings: Settings, checkpoints: Path) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_CHUNK_ROWS = 40  # three chunks: the usage is summed across them


@pytest.fixture
def host(make_server: Callable[..., LocalServer], ca: Any, trust_ca: None,
         loopback: None) -> LocalServer:
    """The rows' media host, on this machine."""
    server = make_server(tls=tls_context(ca, "127.0.0.1"))
    for path, body in (("/photo.jpg", picture((200, 30, 30), fmt="JPEG")),
                       ("/talk.wav", tone(330, seconds=3)),
                       ("/clip.mp4", clip([(30, 30, 200)] * 30, fps=10))):
        server.routes[path] = partial(reply, status=200, body=body)
    return server


def media_parts(host: LocalServer) -> list[dict[str, Any]]:
    return [
        {"type": "text", "text": "Describe these."},
        {"type": "image_url", "image_url": {"url": host.url("/photo.jpg")}},
        {"type": "audio_url", "audio_url": {"url": host.url("/talk.wav"),
                                            "duration_seconds": 30}},
        {"type": "video_url", "video_url": {"url": host.url("/clip.mp4"),
                                            "duration_seconds": 60}},
    ]


def chat_rows(count: int, host: LocalServer) -> bytes:
    return b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": media_parts(host)}]}}).encode()
        + b"\n" for i in range(count))


@dataclass
class FakeChat:
    """Serves every row, reporting the prompt tokens the estimate counted for it."""

    prompt_tokens: int

    def generate(self, rows: list[ChatRow], settings: ChatSettings) -> list[ChatOutcome]:
        return [ChatOutcome(content="ok", reasoning=None, finish_reason="stop",
                            prompt_tokens=self.prompt_tokens,
                            completion_tokens=settings.max_tokens, reasoning_tokens=0)
                for _ in rows]


def run(job: Job, monkeypatch: pytest.MonkeyPatch) -> Job:
    """Approve over the API, plan, and run every chunk here as a worker would."""
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "chunk_run_task")
    assert job_start(job_id=job.pk) == Chunk.objects.filter(job=job).count() == 3
    with finalizes_run(monkeypatch):  # the last chunk's finalize, as a CPU worker runs it
        for chunk_id in sent:
            chunk_run(chunk_id=chunk_id)
    return Job.objects.get(pk=job.pk)


def served_usage(job: Job) -> Usage:
    """What the rows consumed: the counted prompt split into text and media, the output."""
    text = (job.est_input_tok or 0) // ROWS - MEDIA_TOKENS
    one = ROW_MEDIA + Usage(input_tokens=text, output_tokens=OUTPUT)
    total = Usage()
    for _ in range(ROWS):
        total = total + one
    return total


def test_a_media_job_is_charged_its_surcharges_and_the_charge_is_the_estimate(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch,
        host: LocalServer) -> None:
    # given: 100 rows, each an image, 30 s of audio and a minute of video
    item = input_ready(organization, chat_rows(ROWS, host))
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b",
                               "max_output_tokens": OUTPUT}, format="json")
    assert response.status_code == 200, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    job.refresh_from_db()
    model = model_get("gemma4-12b")
    assert model is not None
    usage = served_usage(job)
    assert job.est_cost_cents == price(model, usage).cents
    # when: it is approved and its rows run
    before = credits_summary(organization=organization)
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    monkeypatch.setattr("inference.kinds.engines.engine_cached",
                        lambda model_id, kind: FakeChat((job.est_input_tok or 0) // ROWS))
    finished = run(job, monkeypatch)
    # then: the charge is the estimate, media and surcharges included
    assert (finished.status, finished.success_rows) == (JobStatus.DONE, ROWS)
    assert finished.cost_cents == job.est_cost_cents == price(model, usage).cents
    # The run's usage, summed over its chunks, is the served usage itself. The rows are
    # one request: each chunk ran it once, and its copies bill as rows that ran (their
    # prompts reported cached whole).
    stored = Usage()
    for chunk in Chunk.objects.filter(job=job):
        stored = stored + usage_from_json(chunk.usage)
    assert stored.merged_rows == ROWS - 3
    assert stored.cached_input_tokens == (ROWS - 3) * (job.est_input_tok or 0) // ROWS
    assert dataclasses.replace(stored, merged_rows=0, cached_input_tokens=0) == usage
    # The surcharges are real money here: 150 minutes at $0.002 and 200 clips.
    without = price(model, Usage(input_tokens=usage.input_tokens + usage.media_tokens,
                                 output_tokens=usage.output_tokens)).cents
    assert finished.cost_cents - without >= 25
    after = credits_summary(organization=organization)
    assert after == Credits(balance=before.balance - finished.cost_cents, held=0)
    ledger = LedgerEntry.objects.filter(job=job)
    assert -sum(e.balance_delta for e in ledger) == finished.cost_cents
    assert sum(e.held_delta for e in ledger) == 0


def test_a_sampled_media_job_prices_media_at_the_media_rate_with_its_surcharges(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch,
        host: LocalServer) -> None:
    # given: the same rows with no max_output_tokens, so the cap comes from a sample
    queued: list[str] = []
    dispatch_catch(monkeypatch, lambda message: queued.append(message.queue), "job_sample_task")
    item = input_ready(organization, chat_rows(ROWS, host))
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b"},
                        format="json")
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
    assert queued == ["sample.world.gemma4-12b"]
    monkeypatch.setattr(
        "jobs.services.sampling.sample_generate",
        lambda job, model: SampleResult(max_output_tokens=OUTPUT, reasoning_budget=None,
                                        tokens_per_second=1_000.0, tokens_used=5_000))
    # when: the sample sets the cap
    assert job_sample(job_id=job.pk) == JobStatus.COST_READY
    job.refresh_from_db()
    # then: the estimate is the media job's price, as with an explicit cap
    model = model_get("gemma4-12b")
    assert model is not None
    usage = served_usage(job)
    assert (job.max_output_tokens, job.sample_tokens) == (OUTPUT, 5_000)
    assert job.est_cost_cents == price(model, usage).cents
    text_rate_only = price(model, Usage(input_tokens=usage.input_tokens + usage.media_tokens,
                                        output_tokens=usage.output_tokens)).cents
    assert job.est_cost_cents - text_rate_only >= 25
    # and the run is charged exactly that
    before = credits_summary(organization=organization)
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    monkeypatch.setattr("inference.kinds.engines.engine_cached",
                        lambda model_id, kind: FakeChat((job.est_input_tok or 0) // ROWS))
    finished = run(job, monkeypatch)
    assert finished.cost_cents == job.est_cost_cents
    assert credits_summary(organization=organization) == Credits(
        balance=before.balance - job.est_cost_cents, held=0)


@dataclass
class FakeEmbed:
    def embed(self, rows: list[EmbedRow]) -> list[EmbedOutcome]:
        return [EmbedOutcome(vector=[1.0, 0.0], prompt_tokens=2_000) for _ in rows]


def test_an_embedding_row_with_media_is_billed_at_the_media_row_rate_with_per_item_charges(
        organization: Organization, monkeypatch: pytest.MonkeyPatch, host: LocalServer) -> None:
    monkeypatch.setattr("inference.kinds.engines.engine_cached",
                        lambda model_id, kind: FakeEmbed())
    job = Job.objects.create(organization=organization, model="qwen3-vl-embedding-8b",
                             task_type="embed", status=JobStatus.IN_PROGRESS)
    video = {"type": "video_url", "video_url": {"url": host.url("/clip.mp4"),
                                                "duration_seconds": 10}}
    image = {"type": "image_url", "image_url": {"url": host.url("/photo.jpg")}}
    rows = [InputRow(0, "text", {"input": "plain"}),
            InputRow(1, "media", {"input": [{"type": "text", "text": "a"}, image, video]}),
            InputRow(2, "parts", {"input": [{"type": "text", "text": "only text"}]})]
    _results, usage = execute(job, rows)
    # The engine does not tell its media tokens apart here: its 2,000 are all taken for
    # media, and the row bills the catalog's (1,280 an image, 11 frames of 256 for 10 s).
    assert usage == Usage(input_tokens=4_000, media_row_tokens=1_280 + 11 * 256, images=1,
                          clips=1, media_seconds=Decimal(10))
