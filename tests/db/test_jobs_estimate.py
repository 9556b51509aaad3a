"""Estimating: rows checked and counted with the model's own tokenizer, priced from exact
counts, cost_ready (or failed with the reference's reason); auto-approve; recovery."""

from __future__ import annotations

import json
import math
import time
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient
from tokenizers import Tokenizer

from billing.services import credits_summary
from console.models import Organization
from inference.catalog import model_get
from inference.pricing import Usage, price
from inference.rows.embeddings import MEDIA_ROW_PREFIX, MEDIA_ROW_SUFFIX
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.estimation import CANNOT_PRICE, job_estimate
from jobs.services.lifecycle import job_finish
from jobs.services.recovery import ESTIMATE, SUBMITTED, lease_recover
from tests.db.test_jobs_submit import uploaded
from tests.dispatched import dispatch_catch
from tests.factories import input_ready, organization_make
from tests.workers import broker_flush, running_worker

JOBS = "/batch/v1/jobs"


@pytest.fixture(autouse=True)
def served(checkpoints: Path) -> None:
    """Every catalog model has its checkpoint (tokenizer) configured."""


def jsonl(*rows: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(row).encode() + b"\n" for row in rows)


def embedding_row(custom_id: str, text: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"input": text}}


def chat_row(custom_id: str, content: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": content}]}}


def count(tokenizer_dir: Path, text: str) -> int:
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    return len(tokenizer.encode(text, add_special_tokens=False).ids)


def submitted(api: APIClient, organization: Organization, content: bytes,
              **fields: Any) -> Job:
    item = input_ready(organization, content)
    response = api.post(JOBS, {"input_id": str(item.pk), **fields}, format="json")
    assert response.status_code == 200, response.content
    return Job.objects.get(pk=response.json()["id"])


@pytest.mark.django_db
def test_an_embedding_job_is_counted_exactly_and_reaches_cost_ready(
        api: APIClient, organization: Organization, checkpoints: Path) -> None:
    texts = ["a plain text string", "Say hello in French.", "Please refund it today."]
    job = submitted(api, organization,
                    jsonl(*(embedding_row(f"r{i}", t) for i, t in enumerate(texts))),
                    model="qwen3-embedding-8b")
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    # Each string row has one end-of-text token appended before it is embedded.
    tokens = sum(count(checkpoints, text) + 1 for text in texts)
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert body["status"] == "cost_ready"
    assert (body["est_input_tok"], body["est_output_tok"]) == (tokens, 0)
    model = model_get("qwen3-embedding-8b")
    assert model is not None
    assert body["est_cost_cents"] == price(model, Usage(input_tokens=tokens)).cents == 1
    assert body["max_output_tokens"] == 0
    assert body["est_processing_seconds"] >= 60
    assert job_estimate(job_id=job.pk) is None  # a redelivered message does nothing


@pytest.mark.django_db
def test_a_decision_job_counts_the_text_once_per_question(api: APIClient,
                                                         organization: Organization,
                                                         checkpoints: Path) -> None:
    text = "We were billed twice for March. Please refund it today."
    row = {"custom_id": "t1", "method": "POST", "url": "/v1/systemone", "body": {
        "state": text, "questions": {
            "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
            "team": {"type": "choice", "instructions": "Which team should handle this?",
                     "criteria": {"billing": "invoices, payments, refunds",
                                  "other": "everything else"}}}}}
    job = submitted(api, organization, jsonl(row), model="laya")
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    job.refresh_from_db()
    assert job.est_output_tok == 0
    assert job.est_input_tok is not None and job.est_input_tok >= 2 * count(checkpoints, text)
    assert job.est_cost_cents == 5  # laya's $0.05 minimum job price


@pytest.mark.django_db
def test_a_chat_job_with_an_explicit_cap_is_priced_on_it(api: APIClient,
                                                        organization: Organization) -> None:
    job = submitted(api, organization, jsonl(chat_row("a", "Say hello in French."),
                                             chat_row("b", "Please refund it today.")),
                    model="gemma4-12b", max_output_tokens=500)
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    job.refresh_from_db()
    assert (job.est_output_tok, job.max_output_tokens, job.row_count) == (1000, 500, 2)
    model = model_get("gemma4-12b")
    assert model is not None
    expected = price(model, Usage(input_tokens=job.est_input_tok or 0, output_tokens=1000))
    assert job.est_cost_cents == expected.cents


@pytest.mark.django_db
@pytest.mark.parametrize("fields", [
    {"model": "gemma4-12b"},  # no cap: the cap is estimated from a sample
    {"model": "qwen3.8-27b", "max_output_tokens": 800},  # thinking budget from a sample
])
def test_jobs_that_need_a_sample_wait_in_estimating_checked(api: APIClient,
                                                            organization: Organization,
                                                            fields: dict[str, Any]) -> None:
    job = submitted(api, organization, jsonl(chat_row("a", "hi")), **fields)
    assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
    job.refresh_from_db()
    assert (job.status, job.row_count, job.est_cost_cents) == (JobStatus.ESTIMATING, 1, None)


@pytest.mark.django_db
@pytest.mark.parametrize("fields", [
    {"reasoning": False}, {"reasoning_budget": 300},
])
def test_a_reasoning_job_with_its_budget_settled_is_priced_at_once(
        api: APIClient, organization: Organization, fields: dict[str, Any]) -> None:
    job = submitted(api, organization, jsonl(chat_row("a", "hi")), model="qwen3.8-27b",
                    max_output_tokens=800, **fields)
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY


@pytest.mark.django_db
@pytest.mark.parametrize("model,rows,reason", [
    ("qwen3-embedding-8b", [embedding_row("e1", ["a", "b"])],
     "Row 'e1': embeddings input must be a single string per row, not a list (submit one "
     "row per input)"),
    ("qwen3.8-27b", [chat_row("clip-7", [{"type": "video_url", "video_url": {
        "url": "https://example.com/clip.mp4", "duration_seconds": 45}}])],
     "Row 'clip-7': video is 45 s; at the requested 20 fps the longest clip qwen3.8-27b "
     "takes is 38 s. Shorten the clip or lower video_fps."),
    ("gemma4-12b", [chat_row("x", [{"type": "audio_url", "audio_url": {
        "url": "https://example.com/clip.mp3", "duration_seconds": 45}}])],
     "Row 'x': audio duration 45s exceeds the 30s maximum for model 'gemma4-12b'. Shorten "
     "or split this audio input."),
    ("gemma4-12b", [chat_row("a", "hi"), chat_row("a", "again")],
     "Row 'a': custom_id is used by an earlier line; every row needs its own custom_id"),
])
def test_a_row_that_breaks_a_rule_fails_the_job_unbilled(api: APIClient,
                                                         organization: Organization,
                                                         model: str, rows: list[Any],
                                                         reason: str) -> None:
    fields: dict[str, Any] = {"model": model}
    if model == "qwen3.8-27b":
        fields.update(video_fps=20, max_output_tokens=100, reasoning=False)
    elif model == "gemma4-12b":
        fields["max_output_tokens"] = 100
    before = credits_summary(organization=organization)
    job = submitted(api, organization, jsonl(*rows), **fields)
    assert job_estimate(job_id=job.pk) == JobStatus.FAILED
    body = api.get(f"{JOBS}/{job.pk}").json()
    assert (body["status"], body["failure_code"]) == ("failed", "invalid_input")
    assert body["failure_reason"] == reason
    assert credits_summary(organization=organization) == before


@pytest.mark.django_db
def test_a_model_with_no_checkpoint_cannot_be_priced(api: APIClient, organization: Organization,
                                                    settings: Settings) -> None:
    settings.ANEX_CHECKPOINTS = {}
    job = submitted(api, organization, jsonl(embedding_row("a", "x")),
                    model="qwen3-embedding-8b")
    assert job_estimate(job_id=job.pk) == JobStatus.FAILED
    job.refresh_from_db()
    assert (job.failure_code, job.failure_reason) == ("invalid_input", CANNOT_PRICE)


CLIP_7 = chat_row("clip-7", [{"type": "video_url", "video_url": {
    "url": "https://example.com/clip.mp4", "duration_seconds": 45}}])
GEMMA_AUDIO = chat_row("x", [{"type": "audio_url", "audio_url": {
    "url": "https://example.com/clip.mp3", "duration_seconds": 45}}])
AUDIO_PART = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
IMAGE_PART = {"type": "image_url", "image_url": {"url": "https://example.com/photo.jpg"}}
NO_TOKENIZER_FIELDS: dict[str, dict[str, Any]] = {
    "qwen3.8-27b": {"video_fps": 20, "max_output_tokens": 100, "reasoning": False},
    "gemma4-12b": {"max_output_tokens": 100},
    "qwen3-embedding-8b": {},
}


def estimated_through_the_api(api: APIClient, content: bytes, model: str) -> dict[str, Any]:
    """Upload, submit and estimate as a customer's job goes; the job as GET /jobs answers."""
    input_id = uploaded(api, content)
    response = api.post(JOBS, {"input_id": input_id, "model": model,
                               **NO_TOKENIZER_FIELDS[model]}, format="json")
    assert response.status_code == 200, response.content
    job_id = response.json()["id"]
    assert job_estimate(job_id=job_id) == JobStatus.FAILED
    return dict(api.get(f"{JOBS}/{job_id}").json())


@pytest.mark.django_db
@pytest.mark.parametrize("model,row,reason", [
    ("qwen3.8-27b", CLIP_7,
     "Row 'clip-7': video is 45 s; at the requested 20 fps the longest clip qwen3.8-27b "
     "takes is 38 s. Shorten the clip or lower video_fps."),
    ("gemma4-12b", GEMMA_AUDIO,
     "Row 'x': audio duration 45s exceeds the 30s maximum for model 'gemma4-12b'. Shorten "
     "or split this audio input."),
    ("qwen3-embedding-8b", embedding_row("a", [AUDIO_PART]),
     "Row 'a': model 'qwen3-embedding-8b' has no encoder for audio input: no embedding "
     "model takes audio"),
    ("qwen3-embedding-8b", embedding_row("i", [IMAGE_PART]),
     "Row 'i': model 'qwen3-embedding-8b' has no encoder for image input (it takes text); "
     "choose a model that takes image"),
    ("qwen3-embedding-8b", {**embedding_row("f", "x"), "body": {
        "input": "x", "encoding_format": "base64"}},
     "Row 'f': encoding_format must be \"float\", not 'base64'; vectors are returned as "
     "floats"),
])
def test_row_checks_come_before_pricing_on_a_model_with_no_tokenizer(
        api: APIClient, organization: Organization, settings: Settings, model: str,
        row: dict[str, Any], reason: str) -> None:
    # No tokenizer for any model here: the reference's ids without weights in a deployment.
    settings.ANEX_CHECKPOINTS = {}
    before = credits_summary(organization=organization)
    valid = chat_row("ok", "Say hello in French.") if model != "qwen3-embedding-8b" \
        else embedding_row("ok", "a plain text string")
    body = estimated_through_the_api(api, jsonl(valid, row), model)
    assert (body["status"], body["failure_code"]) == ("failed", "invalid_input")
    assert body["failure_reason"] == reason
    # The same file without the broken row passes its checks, and only then lacks a price.
    body = estimated_through_the_api(api, jsonl(valid), model)
    assert (body["status"], body["failure_code"]) == ("failed", "invalid_input")
    assert body["failure_reason"] == CANNOT_PRICE
    assert credits_summary(organization=organization) == before


@pytest.mark.django_db
@pytest.mark.parametrize("model_id,text_rate,media_rate,per_image,per_clip", [
    # "Embedding jobs", which wins over the models table
    # (docs/dev/decisions/2026-12-01-models-limits-and-pricing.md).
    ("qwen3-vl-embedding-8b", "0.03", "0.08", "4", "60"),
    ("qwen3-vl-embedding-2b", "0.007", "0.02", "2", "20"),
])
def test_a_vl_embedding_job_is_priced_text_only_or_with_media_plus_per_item(
        api: APIClient, organization: Organization, checkpoints: Path, model_id: str,
        text_rate: str, media_rate: str, per_image: str, per_clip: str) -> None:
    text = "a plain text string " * 2_500
    video = {"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4",
                                                "duration_seconds": 10}}
    rows = [embedding_row(f"t{i}", text) for i in range(100)] + [
        embedding_row(f"i{i}", [IMAGE_PART]) for i in range(1_000)] + [
        embedding_row(f"v{i}", [{"type": "text", "text": "a caption"}, video])
        for i in range(1_000)]
    job = submitted(api, organization, jsonl(*rows), model=model_id)
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    # A string row gets one end-of-text token; a media row is the chat template around its
    # text, plus 1,280 tokens an image or 11 frames of 256 (10 s at the fixed 1 fps).
    text_row = count(checkpoints, text) + 1
    image_row = count(checkpoints, MEDIA_ROW_PREFIX + MEDIA_ROW_SUFFIX) + 1_280
    video_row = count(checkpoints, MEDIA_ROW_PREFIX + "a caption" + MEDIA_ROW_SUFFIX) \
        + 11 * 256
    text_tokens, media_tokens = 100 * text_row, 1_000 * (image_row + video_row)
    exact = (text_tokens * Decimal(text_rate) + media_tokens * Decimal(media_rate)
             + 1_000 * Decimal(per_image) + 1_000 * Decimal(per_clip)) / 1_000_000
    job.refresh_from_db()
    assert (job.est_input_tok, job.est_output_tok) == (text_tokens + media_tokens, 0)
    assert job.est_cost_cents == math.ceil(exact * 100)
    # The charge goes through the same function: a run that consumed exactly what was
    # counted is charged exactly the estimate, and the ledger moves by that and no more.
    model = model_get(model_id)
    assert model is not None
    served = Usage(input_tokens=text_tokens, media_row_tokens=media_tokens, images=1_000,
                   clips=1_000, media_seconds=Decimal(10_000))
    assert price(model, served).exact_usd == exact
    before = credits_summary(organization=organization)
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    assert credits_summary(organization=organization).held == job.est_cost_cents
    Job.objects.filter(pk=job.pk).update(status=JobStatus.FINALIZING)  # its rows have run
    job_finish(job=job, status=JobStatus.DONE, cost_cents=price(model, served).cents)
    after = credits_summary(organization=organization)
    assert (after.held, before.balance - after.balance) == (0, job.est_cost_cents)


@pytest.mark.django_db
def test_an_auto_approve_organization_goes_straight_to_in_progress(client_for) -> None:  # type: ignore[no-untyped-def]
    from tests.factories import api_key_make

    organization = organization_make(auto_approve=True)
    _key, plaintext = api_key_make(organization)
    job = submitted(client_for(plaintext), organization, jsonl(embedding_row("a", "x")),
                    model="qwen3-embedding-8b")
    job_estimate(job_id=job.pk)
    job.refresh_from_db()
    assert job.status == JobStatus.IN_PROGRESS
    assert credits_summary(organization=organization).held == job.est_cost_cents


@pytest.mark.django_db
def test_lost_and_abandoned_estimates_are_recovered(api: APIClient, organization: Organization,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "job_estimate_task")
    rows = jsonl(embedding_row("a", "x"))
    lost = submitted(api, organization, rows, model="qwen3-embedding-8b")
    dead = submitted(api, organization, rows, model="qwen3-embedding-8b")
    hopeless = submitted(api, organization, rows, model="qwen3-embedding-8b")
    long_ago = timezone.now() - timedelta(hours=2)
    Job.objects.filter(pk=lost.pk).update(leased_at=long_ago)
    Job.objects.filter(pk__in=[dead.pk, hopeless.pk]).update(
        status=JobStatus.ESTIMATING, leased_at=long_ago, claimed=True, attempts=1)
    Job.objects.filter(pk=hopeless.pk).update(attempts=ESTIMATE.attempts)
    now = timezone.now()
    assert lease_recover(SUBMITTED, now) + lease_recover(ESTIMATE, now) == 3
    assert sorted(sent) == sorted([str(lost.pk), str(dead.pk)])
    hopeless.refresh_from_db()
    assert (hopeless.status, hopeless.failure_code) == (JobStatus.FAILED, "internal_error")
    # The abandoned one is claimed again and finishes.
    assert job_estimate(job_id=dead.pk) == JobStatus.COST_READY


@pytest.mark.django_db(transaction=True)
def test_end_to_end_submit_to_cost_ready_through_a_worker(client_for) -> None:  # type: ignore[no-untyped-def]
    from tests.factories import api_key_make

    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    api = client_for(plaintext)
    item = input_ready(organization, jsonl(embedding_row("a", "a plain text string")))
    broker_flush()
    job_id = api.post(JOBS, {"input_id": str(item.pk), "model": "qwen3-embedding-8b"},
                      format="json").json()["id"]
    with running_worker():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and \
                Job.objects.get(pk=job_id).status != JobStatus.COST_READY:
            time.sleep(0.02)
    assert api.get(f"{JOBS}/{job_id}").json()["status"] == "cost_ready"
