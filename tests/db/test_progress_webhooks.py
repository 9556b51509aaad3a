"""`progress` webhooks: an organization that opts in (console Settings, createorg
--progress-webhooks) gets one signed event per job at 25, 50 and 75 % of its rows, through
the outbox, before the job's final event; never twice for a threshold."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from pytest_django import Settings

from console.constants import AuditAction, Role
from console.models import AuditEvent, Organization
from console.selectors import organization_webhook_secret
from inference.constants import RowOutcome
from inference.pricing import Usage
from jobs.constants import JobStatus
from jobs.models import Chunk, Job, WebhookDelivery
from jobs.services.lifecycle import job_approve
from jobs.services.progress import job_progress_notify
from jobs.services.running import chunk_run, job_start
from jobs.services.webhook_endpoint import organization_webhook_set
from tests.chunks import chunk_done, row_record
from tests.db.test_console import form, signed_in
from tests.db.test_webhooks import deliver_all, hooks, receiver, verified  # noqa: F401
from tests.dispatched import finalizes_run
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import SYSTEM, input_ready, job_make, organization_make
from tests.servers import LocalServer

pytestmark = pytest.mark.django_db
ENDPOINT = "https://93.184.215.14/hook"


@pytest.fixture(autouse=True)
def setup(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_CHUNK_ROWS = 2


def opted_in(url: str = ENDPOINT, *, on: bool = True) -> Organization:
    organization = organization_make(progress_webhooks=on)
    return organization_webhook_set(organization=organization, actor=SYSTEM, url=url)


def embedding_lines(rows: int) -> bytes:
    return b"".join(json.dumps({"custom_id": f"e{i}", "method": "POST",
                                "url": "/v1/embeddings", "body": {"input": f"text {i}"}}
                               ).encode() + b"\n" for i in range(rows))


def running(organization: Organization, rows: int, *,
            model: str = "qwen3-embedding-8b") -> Job:
    item = input_ready(organization, embedding_lines(rows))
    job = job_make(organization, est_cost_cents=100, model=model)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, task_type="embed",
                                         max_output_tokens=0)
    job = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    job_start(job_id=job.pk)
    return job


def finish(chunk: Chunk) -> None:
    """A chunk recorded done, as chunk_run records it."""
    chunk_done(chunk, [row_record(i, f"e{i}", RowOutcome.SUCCESS, Usage(input_tokens=3),
                                  embedding=[0.0])
                       for i in range(chunk.first_row, chunk.first_row + chunk.row_count)])


def progress_events(job: Job) -> list[dict[str, Any]]:
    return [d.payload["data"] for d in WebhookDelivery.objects.filter(
        job=job, event_type="progress").order_by("created_at", "id")]


def test_one_event_at_each_of_25_50_75_percent(sent: list[str]) -> None:
    # given an opted-in organization's 16-row job in 8 chunks
    job = running(opted_in(), 16)
    chunks = list(job.chunks.order_by("index"))
    percents = []
    for chunk in chunks:
        finish(chunk)
        job_progress_notify(job_id=job.pk)
        job_progress_notify(job_id=job.pk)  # a redelivered chunk's second call
        percents.append([e["percent"] for e in progress_events(job)])
    # then each threshold was recorded once, as the chunk that crossed it finished
    assert percents == [[], [25], [25], [25, 50], [25, 50], [25, 50, 75], [25, 50, 75],
                        [25, 50, 75]]
    assert progress_events(job)[1] == {"job_id": str(job.pk), "percent": 50, "done_rows": 8,
                                       "total_rows": 16, "rows_readable_after": 8}


def test_the_event_carries_the_cursor_readable_now(sent: list[str]) -> None:
    # given a 16-row job in 8 chunks whose later chunks finish first
    job = running(opted_in(), 16)
    chunks = list(job.chunks.order_by("index"))
    for chunk in (chunks[3], chunks[1]):
        finish(chunk)
    job_progress_notify(job_id=job.pk)
    # 4 rows are done, but the first chunk is not: no line is readable yet
    assert progress_events(job)[-1]["done_rows"] == 4
    assert progress_events(job)[-1]["rows_readable_after"] == 0
    for chunk in (chunks[0], chunks[5]):
        finish(chunk)
    job_progress_notify(job_id=job.pk)
    # with the first done too, the lines of rows 0 to 3 are (the third chunk is not)
    assert progress_events(job)[-1]["done_rows"] == 8
    assert progress_events(job)[-1]["rows_readable_after"] == 4


def test_a_chunk_that_crosses_several_thresholds_sends_each_in_order(sent: list[str]) -> None:
    job = running(opted_in(), 4)  # two chunks of 2: the first reaches 50 %
    finish(job.chunks.get(index=0))
    job_progress_notify(job_id=job.pk)
    assert [e["percent"] for e in progress_events(job)] == [25, 50]


@pytest.mark.parametrize("on, url", [(False, ENDPOINT), (True, "")])
def test_nothing_without_the_setting_or_an_endpoint(sent: list[str], on: bool,
                                                    url: str) -> None:
    organization = organization_make(progress_webhooks=on)
    if url:
        organization_webhook_set(organization=organization, actor=SYSTEM, url=url)
    job = running(organization, 4)
    for chunk in job.chunks.all():
        finish(chunk)
    assert job_progress_notify(job_id=job.pk) == []
    assert not WebhookDelivery.objects.filter(event_type="progress").exists()


def test_the_event_is_signed_and_delivered_like_every_job_event(
        sent: list[str], receiver: LocalServer) -> None:  # noqa: F811
    organization = opted_in(receiver.url("/hook"))
    secret = organization_webhook_secret(organization=organization)
    assert secret is not None
    job = running(organization, 8)
    finish(job.chunks.get(index=0))
    job_progress_notify(job_id=job.pk)
    deliver_all()
    events = [verified(seen, secret) for seen in hooks(receiver)]
    progress = [e for e in events if e["type"] == "progress"]
    assert [e["data"] for e in progress] == [
        {"job_id": str(job.pk), "percent": 25, "done_rows": 2, "total_rows": 8,
         "rows_readable_after": 2}]
    # after the job's in_progress event, as recorded
    assert [e["type"] for e in events][-2:] == ["in_progress", "progress"]


def test_owners_turn_it_on_in_settings(organization: Organization) -> None:
    owner, _user = signed_in(organization)
    page = owner.get("/console/settings").content.decode()
    assert 'name="progress_webhooks"' in page
    owner.post("/console/settings", form(organization, {"action": "progress_webhooks",
                                                        "progress_webhooks": "on"}))
    organization.refresh_from_db()
    assert organization.progress_webhooks
    assert 'name="progress_webhooks" checked' in owner.get("/console/settings").content.decode()
    owner.post("/console/settings", form(organization, {"action": "progress_webhooks"}))
    organization.refresh_from_db()
    assert not organization.progress_webhooks
    member: Client = signed_in(organization, Role.MEMBER)[0]
    assert member.post("/console/settings", form(organization, {"action": "progress_webhooks",
                                             "progress_webhooks": "on"})).status_code == 403
    organization.refresh_from_db()
    assert not organization.progress_webhooks
    # the change is audited like every setting
    changes = [event.data for event in AuditEvent.objects.for_org(organization).filter(
        action=AuditAction.ORGANIZATION_UPDATED).order_by("id")]
    assert {"progress_webhooks": {"from": False, "to": True}} in changes


@pytest.mark.urls("tests.urls")
def test_createorg_takes_progress_webhooks() -> None:
    def createorg(*args: str) -> Organization:
        out = io.StringIO()
        call_command("createorg", *args, stdout=out)
        return Organization.objects.get(pk=json.loads(out.getvalue())["organization_id"])

    assert createorg("--name", "On", "--progress-webhooks").progress_webhooks
    assert not createorg("--name", "Off").progress_webhooks


@pytest.mark.django_db(transaction=True)
def test_a_real_run_sends_the_thresholds_before_completed(
        settings: Settings, sent: list[str], monkeypatch: pytest.MonkeyPatch,
        checkpoint_dirs: dict[str, Path]) -> None:  # noqa: F811
    settings.ANEX_CHECKPOINTS = {"all-minilm-l6-v2": checkpoint_dirs["minilm"]}
    job = running(opted_in(), 8, model="all-minilm-l6-v2")
    with finalizes_run(monkeypatch):  # the last chunk's finalize, on a CPU worker
        for chunk_id in sent:
            chunk_run(chunk_id=chunk_id)
    job.refresh_from_db()
    assert job.status == JobStatus.DONE
    events = [(d.event_type, d.payload["data"].get("percent")) for d in
              WebhookDelivery.objects.filter(job=job).order_by("created_at", "id")]
    assert events == [("in_progress", None), ("progress", 25), ("progress", 50),
                      ("progress", 75), ("completed", None)]
