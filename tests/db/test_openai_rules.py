"""Issue 42 item 4: the OpenAI surface on the shared rules. Its batch's usage is the usage the
job is charged on, media rows included (chunks written before the media-row keys were
renamed too); its jobs' policy is stored on the job and read by the core, which never asks
which surface a job came from; its upload is an input admitted and format-checked as every
input is."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from pytest_django import Settings
from rest_framework.test import APIClient

from anex.errors import Conflict
from anex.regions import Region
from billing.constants import EntryKind
from billing.models import LedgerEntry
from console.actors import Actor
from console.models import Organization
from inference.catalog import model_get
from inference.constants import RowOutcome
from inference.pricing import Usage, price
from inference.rows.core import JobOptions
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.estimation import job_estimate
from jobs.services.lifecycle import job_approve, job_cancel
from jobs.services.metering import job_usage_done
from jobs.services.rows import rows_read
from jobs.services.running import job_finalize, job_start
from jobs.services.submission import JobRequest, job_submit
from openai_api.models import FilePurpose, OpenAIBatch, OpenAIFile
from tests.chunks import chunk_done, row_record
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, api_key_make, input_ready, job_make

CHAT, MEDIA_EMBED, EMBED = "qwen3.8-27b", "qwen3-vl-embedding-8b", "qwen3-embedding-8b"
FAILED = {1, 4}


@pytest.fixture(autouse=True)
def setup(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = 2


def request_line(model: str, custom_id: str) -> bytes:
    url = "/v1/chat/completions" if model == CHAT else "/v1/embeddings"
    body: dict[str, Any] = ({"model": model, "messages": [{"role": "user", "content": "hi"}]}
                            if model == CHAT else {"model": model, "input": "text"})
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url,
                       "body": body}).encode() + b"\n"


# What each answered row used, as its chunk records it: a chat row's image tokens
# (media_tokens); an embedding row carrying an image or a video, in the keys chunks were
# written with before the media-row rates were one (inference.pricing.USAGE_RENAMED), which
# the job is still charged on.
ROW_USAGE = {CHAT: {"input_tokens": 10, "media_tokens": 20, "output_tokens": 5,
                    "cached_input_tokens": 12},
             MEDIA_EMBED: {"input_tokens": 3, "image_row_tokens": 4, "video_row_tokens": 3}}


def running_batch(organization: Organization, model: str, rows: int = 7) -> OpenAIBatch:
    """An OpenAI batch whose job has run every chunk (rows FAILED refused), not yet
    finalized, each answered row's usage in its chunk as ROW_USAGE has it."""
    item = input_ready(organization, b"".join(request_line(model, f"r{i}")
                                              for i in range(rows)))
    job = job_make(organization, est_cost_cents=5000, model=model)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, approve_at_estimate=True,
                                         collect_row_errors=True, row_model=True)
    job = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        read = list(rows_read(job, chunk))
        chunk_done(chunk, [row_record(
            row.index, row.ident,
            RowOutcome.ERROR if row.index in FAILED else RowOutcome.SUCCESS,
            Usage(input_tokens=1), answer="ok" if model == CHAT else None,
            embedding=None if model == CHAT else [0.5, 0.25]) for row in read])
        answered = sum(row.index not in FAILED for row in read)
        chunk.usage = {name: count * answered for name, count in ROW_USAGE[model].items()}
        chunk.save(update_fields=["usage"])
    file = OpenAIFile.objects.create(organization=organization, purpose=FilePurpose.BATCH,
                                     filename="in.jsonl", input=item,
                                     bytes=item.size_bytes or 0)
    return OpenAIBatch.objects.create(
        organization=organization, job=Job.objects.get(pk=job.pk), input_file=file,
        endpoint="/v1/chat/completions" if model == CHAT else "/v1/embeddings")


@pytest.mark.parametrize("model", [CHAT, MEDIA_EMBED])
def test_an_openai_batchs_usage_is_what_the_batch_api_charges_its_job_on_media_included(
        api: APIClient, organization: Organization, sent: list[str], model: str) -> None:
    batch = running_batch(organization, model)
    assert batch.job is not None
    job_id = batch.job.pk
    # what the job is charged on: its done chunks' usage, old media-row keys included
    charged_on = job_usage_done(job_id)
    answered = 7 - len(FAILED)
    assert charged_on.all_input_tokens == answered * (30 if model == CHAT else 10)
    # of which the rows' cached tokens (a chat row's; billed at the input rate all the same)
    assert charged_on.cached_input_tokens == (answered * 12 if model == CHAT else 0)
    # while it runs (summed from the chunks) and once it has ended (recorded)
    running = api.get(f"/openai/v1/batches/{batch.id}").json()["usage"]
    assert job_finalize(job_id=job_id) == JobStatus.DONE
    done = api.get(f"/openai/v1/batches/{batch.id}").json()["usage"]
    assert running == done == {
        "input_tokens": charged_on.all_input_tokens,
        "input_tokens_details": {"cached_tokens": charged_on.cached_input_tokens},
        "output_tokens": charged_on.output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": charged_on.all_input_tokens + charged_on.output_tokens}
    # and the job is charged on that same usage, as every anex job is
    catalog_model = model_get(model)
    assert catalog_model is not None
    charge = price(catalog_model, charged_on).cents
    assert Job.objects.get(pk=job_id).cost_cents == charge > 0
    assert -sum(LedgerEntry.objects.filter(job_id=job_id, kind=EntryKind.CHARGE)
                .values_list("balance_delta", flat=True)) == charge


# -- the policy, stored: the core reads it, never the surface ---------------------------------

def embedding_line(custom_id: str) -> bytes:
    """An anex API row of an embedding job: the model is the job's, not named in the row."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                       "body": {"input": "a plain text"}}).encode() + b"\n"


def test_the_policy_is_the_jobs_whoever_submits_it(
        organization: Organization, checkpoints: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dispatch_catch(monkeypatch, lambda sent: None, "job_estimate_task", "job_start_task")
    key, _plaintext = api_key_make(organization)
    item = input_ready(organization, embedding_line("a") + embedding_line("b"))
    request = JobRequest(options=JobOptions(model=EMBED), input_id=str(item.pk))
    # given two jobs of the anex path on the same rows, one submitted with a policy
    policied = job_submit(organization=organization, actor=Actor(key=key), request=request,
                          host_region=Region.WORLD, approve_at_estimate=True,
                          collect_row_errors=True)
    plain = job_submit(organization=organization, actor=Actor(key=key), request=request,
                       host_region=Region.WORLD)
    # when each is estimated
    job_estimate(job_id=policied.pk)
    job_estimate(job_id=plain.pk)
    # then the one with no approval step is approved at once, the other waits for one;
    # neither is an OpenAI batch's, and rows naming no model pass where row_model is off
    policied.refresh_from_db()
    plain.refresh_from_db()
    assert not OpenAIBatch.objects.exists()
    assert (policied.status, policied.row_model) == (JobStatus.IN_PROGRESS, False)
    assert policied.approved_at is not None and policied.input_errors is None
    assert plain.status == JobStatus.COST_READY and plain.approved_at is None


def test_a_cancel_before_the_estimate_is_kept_only_where_there_is_no_approval_step(
        organization: Organization) -> None:
    policied = job_make(organization, status=JobStatus.ESTIMATING)
    Job.objects.filter(pk=policied.pk).update(approve_at_estimate=True)
    plain = job_make(organization, status=JobStatus.ESTIMATING)
    kept = job_cancel(job=Job.objects.get(pk=policied.pk), actor=SYSTEM)
    assert (kept.status, kept.cancel_requested) == (JobStatus.ESTIMATING, True)
    with pytest.raises(Conflict):
        job_cancel(job=Job.objects.get(pk=plain.pk), actor=SYSTEM)
    assert Job.objects.get(pk=plain.pk).cancel_requested is False


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_openai_jobs_the_policy_and_no_other_job() -> None:
    before = [("jobs", "0020_chunk_engine_failures")]
    after = [("jobs", "0021_job_policy")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        loader = MigrationExecutor(connection).loader
        old = loader.project_state([*before, *(node for node in loader.graph.leaf_nodes()
                                               if node[0] != "jobs")]).apps
        organization = old.get_model("console", "Organization").objects.create(name="old")
        old_job = old.get_model("jobs", "Job")
        openai_job = old_job.objects.create(organization=organization, model=EMBED,
                                            openai=True)
        anex_job = old_job.objects.create(organization=organization, model=EMBED)
        MigrationExecutor(connection).migrate(after)
        policy = ("approve_at_estimate", "collect_row_errors", "row_model")
        assert Job.objects.values_list(*policy).get(pk=openai_job.pk) == (True, True, True)
        assert Job.objects.values_list(*policy).get(pk=anex_job.pk) == (False, False, False)
        # (only the columns 0021 has: a later migration's are not there yet)
        assert Job.objects.only(*policy).get(pk=openai_job.pk).options().row_model is True
    finally:  # the test database as every other test finds it
        latest = MigrationExecutor(connection)
        latest.migrate(latest.loader.graph.leaf_nodes())


# -- the upload, checked at its batch's create as every input is checked ----------------------

def test_a_blank_file_is_openais_empty_file_as_the_input_check_finds_it_empty(
        api: APIClient) -> None:
    # a byte-order mark and blank lines: not zero bytes, and empty to the format check
    # (jobs.services.inputs.format_problem) that fails such an anex upload
    uploaded = api.post("/openai/v1/files", {"purpose": "batch", "file": io.BytesIO(
        b"\xef\xbb\xbf\n  \n\n")}, format="multipart")
    assert uploaded.status_code == 200, uploaded.content
    batch = api.post("/openai/v1/batches", {
        "input_file_id": uploaded.json()["id"], "endpoint": "/v1/embeddings",
        "completion_window": "24h"}, format="json").json()
    assert batch["status"] == "failed" and batch["anex_job_id"] is None
    assert [error["code"] for error in batch["errors"]["data"]] == ["empty_file"]
    assert not Job.objects.exists()
