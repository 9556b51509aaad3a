"""The job as a picture in the console (issue 44 item 3): a done chunk records its failed
rows by error (Chunk.error_codes), the job page draws rows over time with the ETA, the rows
by outcome with a link to each error's rows, the cost so far against the hold (then the
charge) and the tier; an error's rows page reads only the chunks that have it, is the
member's organization's alone, and shows nothing once the data is deleted; the Billing
page draws spend per day by model.

The job runs through the real pipeline (the API's submit, the estimate, approval, the
start, each chunk's run on the worker's path, the finalize) with the chat engine replaced
and a real HTTPS media host on this machine answering 429 and 404, as
tests/db/test_media_serving.py runs one. The browser walk is
tests/browser/test_job_picture_browser.py."""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.selectors import job_money
from console.models import Organization
from console.selectors import REALTIME_SPEND, spend_per_day
from console.views.charts import rows_chart
from inference.catalog import model_get
from inference.kinds import media as kinds_media
from inference.pricing import Usage, price, usage_from_json
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.results import chunk_key
from jobs.selectors import Progress
from jobs.services.data import job_data_delete
from jobs.services.estimation import job_estimate
from jobs.services.metering import job_cost_so_far
from jobs.services.outcomes import ErrorRows, TimePoint, error_key, job_outcomes
from jobs.services.running import chunk_run, job_finalize, job_start
from jobs.storage import storage_for
from tests.db.test_console import signed_in
from tests.db.test_console_hardening import assert_strict
from tests.db.test_media_serving import (
    engine,  # noqa: F401
    image,
    serves,
)
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, api_key_make, input_ready, job_make, organization_make
from tests.media import data_uri, picture
from tests.servers import LocalServer, reply, tls_context

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
RED = (255, 0, 0)
# Nine rows: five good, two whose image host answers 429, one 404, one damaged image. The
# plan groups rows that share work (jobs.validation.grouping), so its three chunks of three
# hold [0, 2, 3], [8, 1, 4] and [5, 6, 7]: the 429s fall in the second and the third.
LIMITED, GONE = "media_fetch_error:429", "media_fetch_error:404"
DAMAGED = "invalid_request_error:invalid_media"
DAMAGED_GIF = b"GIF89a" + b"\x00" * 64


@pytest.fixture
def host(make_server: Callable[..., LocalServer], ca: Any, trust_ca: None,
         loopback: None) -> LocalServer:
    server = make_server(tls=tls_context(ca, "127.0.0.1"))
    server.routes["/red.png"] = serves(picture(RED))
    server.routes["/limited.png"] = lambda handler: reply(handler, 429, b"slow down")
    server.routes["/gone.png"] = lambda handler: reply(handler, 404, b"no")
    return server


class Run:
    """A job of nine rows, approved and started; its chunks run one by one on demand."""

    def __init__(self, job: Job, chunk_ids: list[str]) -> None:
        self.job = job
        self.chunk_ids = chunk_ids

    def chunks(self, count: int) -> None:
        for _ in range(count):
            chunk_run(chunk_id=self.chunk_ids.pop(0))

    def refreshed(self) -> Job:
        self.job.refresh_from_db()
        return self.job


def started(api: APIClient, organization: Organization, parts: list[dict[str, Any]],
            monkeypatch: pytest.MonkeyPatch) -> Run:
    """A gemma4-12b job of one row per image part, through the API's submit, the estimate
    and approval (a minute ago: the pace, and so the ETA, is measured from approval), then
    started: its chunks wait for Run.chunks."""
    lines = b"".join(json.dumps({
        "custom_id": f"row-{i}", "method": "POST", "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "Name its colour."}, part]}]}}).encode() + b"\n"
        for i, part in enumerate(parts))
    item = input_ready(organization, lines)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b",
                               "max_output_tokens": 8}, format="json")
    job = Job.objects.get(pk=response.json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    Job.objects.filter(pk=job.pk).update(approved_at=timezone.now() - timedelta(minutes=1))
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "chunk_run_task")
    dispatch_catch(monkeypatch, lambda message: None, "job_finalize_task")
    job_start(job_id=job.pk)
    return Run(Job.objects.get(pk=job.pk), sent)


@pytest.fixture
def run(api: APIClient, organization: Organization, settings: Settings, checkpoints: Any,
        engine: Any, host: LocalServer, monkeypatch: pytest.MonkeyPatch) -> Run:  # noqa: F811
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_CHUNK_ROWS = 3
    monkeypatch.setattr(kinds_media, "FETCH_RETRY_SECONDS", (0.01, 0.01))
    red = data_uri(picture(RED), "image/png")
    parts = [image(red), image(host.url("/red.png")), image(red),
             image(red), image(host.url("/limited.png")), image(host.url("/limited.png")),
             image(host.url("/gone.png")), image(data_uri(DAMAGED_GIF, "image/gif")),
             image(red)]
    started_run = started(api, organization, parts, monkeypatch)
    assert len(started_run.chunk_ids) == 3
    return started_run


def test_an_error_is_counted_under_its_type_and_its_code() -> None:
    assert error_key({"type": "media_fetch_error", "code": "429"}) == LIMITED
    assert error_key({"type": "invalid_request_error", "code": "invalid_media"}) == DAMAGED
    assert error_key({"type": "invalid_request_error", "code": None}) == "invalid_request_error"
    assert error_key({"type": "format_error", "code": ""}) == "format_error"
    assert error_key({"message": "no type"}) == "error"


def test_a_done_chunk_records_its_failed_rows_by_error(run: Run) -> None:
    run.chunks(3)
    # each chunk's counts are its result's failed rows, by error
    for chunk in Chunk.objects.filter(job=run.job):
        results = [json.loads(line) for line in storage_for("world").open(
            chunk_key(run.job, chunk.index))]
        assert chunk.error_codes == dict(Counter(
            f"{row['error']['type']}:{row['error']['code']}" for row in results
            if row["error"])), chunk.index
    assert [chunk.error_codes for chunk in Chunk.objects.filter(job=run.job)] == [
        {}, {LIMITED: 1}, {LIMITED: 1, GONE: 1, DAMAGED: 1}]
    outcomes = job_outcomes(job=run.job)
    assert (outcomes.total, outcomes.succeeded, outcomes.failed, outcomes.waiting) == (9, 5, 4, 0)
    assert [(error.key, error.rows) for error in outcomes.errors] == [
        (LIMITED, 2), (DAMAGED, 1), (GONE, 1)]
    assert outcomes.unrecorded == 0


def page_of(client: Client, job: Job) -> str:
    response = client.get(f"/console/jobs/{job.pk}")
    assert_strict(response, "the job page")
    return response.content.decode()


def test_the_job_page_draws_the_job_while_it_runs_and_after_it_ends(
        run: Run, organization: Organization) -> None:
    owner, _ = signed_in(organization)
    # given two of its three chunks done
    run.chunks(2)
    job = run.refreshed()
    assert job.status == JobStatus.IN_PROGRESS
    html = page_of(owner, job)
    # then the rows over time, with the ETA, the outcomes with links, the cost, the tier
    assert 'id="rows-chart"' in html and 'class="area-finished"' in html
    assert 'class="area-failed"' in html and 'class="line-eta"' in html
    assert "6 of 9 rows done (5 finished, 1 failed) " in html
    assert "at this pace the rest are done by about" in html
    errors = f"/console/jobs/{job.pk}/errors?code="
    assert f'href="{errors}media_fetch_error%3A429"' in html
    assert GONE not in html  # its chunk has not run
    assert re.search(r'id="tier">Standard<', html)
    usage = Usage()
    for chunk in Chunk.objects.filter(job=job, status=ChunkStatus.DONE):
        usage = usage + usage_from_json(chunk.usage)
    model = model_get("gemma4-12b")
    assert model is not None
    so_far = price(model, usage).cents
    assert job_cost_so_far(job=job) == so_far
    held = job_money(job_id=job.pk).held
    assert held == job.est_cost_cents and 0 < so_far <= held
    assert f"<strong>${so_far / 100:,.2f}</strong> so far" in html
    assert f"of the ${held / 100:,.2f} held" in html
    # a fragment, what the page's poller fetches, draws the same
    fragment = owner.get(f"/console/jobs/{job.pk}?fragment=1")
    assert fragment["X-Console-Live"] == "1" and 'id="rows-chart"' in fragment.content.decode()

    # when the last chunk runs and the job ends
    run.chunks(1)
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    job = run.refreshed()
    html = page_of(owner, job)
    # then no ETA is drawn, every error links to its rows, and the charge is the job's cost
    assert 'class="line-eta"' not in html
    assert "9 of 9 rows done when the job ended" in html
    for key in (LIMITED, GONE, DAMAGED):
        assert f'href="{errors}{key.replace(":", "%3A")}"' in html
    money = job_money(job_id=job.pk)
    assert money.charged == job.cost_cents and money.released == held - money.charged
    assert f"Charged <strong>${money.charged / 100:,.2f}</strong>" in html


def test_an_errors_rows_are_listed_a_page_at_a_time_from_its_chunks_alone(
        run: Run, organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    owner, _ = signed_in(organization)
    run.chunks(3)
    job_finalize(job_id=run.job.pk)
    read: list[int] = []
    real_read = ErrorRows._read

    def spy(self: ErrorRows, index: int) -> Any:
        read.append(index)
        return real_read(self, index)

    monkeypatch.setattr(ErrorRows, "_read", spy)
    monkeypatch.setattr("console.views.jobs.ERROR_ROWS_PAGE_SIZE", 1)
    url = f"/console/jobs/{run.job.pk}/errors?code=media_fetch_error%3A429"
    first = owner.get(url)
    assert_strict(first, "an error's rows")
    html = first.content.decode()
    assert "<code>row-4</code>" in html and "row-5" not in html
    assert "the host answered HTTP 429" in html and "Page 1 of 2" in html
    second = owner.get(f"{url}&page=2").content.decode()
    assert "<code>row-5</code>" in second and "<code>row-4</code>" not in second
    # each page read the one chunk its row is in, of the two that have the error
    assert read == [1, 2]
    # another error's rows: the 404 and the damaged image, each on its own
    gone = owner.get(f"/console/jobs/{run.job.pk}/errors?code={GONE}").content.decode()
    assert "<code>row-6</code>" in gone and "row-7" not in gone
    # an error the job does not have, and no error at all: 404
    assert owner.get(f"/console/jobs/{run.job.pk}/errors?code=nope").status_code == 404
    assert owner.get(f"/console/jobs/{run.job.pk}/errors").status_code == 404


def test_an_errors_rows_are_another_organizations_404_and_gone_once_the_data_is(
        run: Run, organization: Organization) -> None:
    run.chunks(3)
    job_finalize(job_id=run.job.pk)
    url = f"/console/jobs/{run.job.pk}/errors?code=media_fetch_error%3A429"
    stranger, _ = signed_in(organization_make())
    assert stranger.get(url).status_code == 404
    assert stranger.get(f"/console/jobs/{run.job.pk}").status_code == 404
    owner, _ = signed_in(organization)
    job_data_delete(job=run.refreshed(), actor=SYSTEM)
    response = owner.get(url)
    html = response.content.decode()
    assert response.status_code == 410 and "its rows are gone" in html
    assert "row-4" not in html
    # the job's record stays drawn (counts, cost), without a link to rows that are gone
    page = page_of(owner, run.refreshed())
    assert 'id="outcomes-chart"' in page and "/errors?code=" not in page
    assert "<code>media_fetch_error:429</code>" in page


def test_nothing_is_drawn_before_approval(organization: Organization) -> None:
    owner, _ = signed_in(organization)
    job = job_make(organization, status=JobStatus.COST_READY, est_cost_cents=50)
    html = page_of(owner, job)
    assert "The job as a picture" not in html and 'id="tier">Standard<' in html


def test_the_rows_chart_steps_up_at_each_finish_and_draws_the_eta_to_the_last_row() -> None:
    start = timezone.now() - timedelta(seconds=100)
    points = [TimePoint(at=start + timedelta(seconds=20), finished=10, failed=0),
              TimePoint(at=start + timedelta(seconds=50), finished=15, failed=5)]
    chart = rows_chart(points=points, progress=Progress(done_rows=20, total_rows=40,
                                                        eta_seconds=100, rows_per_second=0.2),
                       start=start, now=start + timedelta(seconds=100), running=True)
    assert chart is not None
    # the span is approval to the ETA (200 s over 600 wide): finishes at x 60 and 150
    assert chart["done_line"] == "M0 200 L60 200 L60 150.5 L150 150.5 L150 101 L300 101"
    assert chart["eta"]["x1"] == "300" and chart["eta"]["x2"] == "600"
    assert chart["eta"]["y1"] == "101" and chart["eta"]["y2"] == "2"
    assert (chart["finished"], chart["failed"]) == (15, 5)
    ended = rows_chart(points=points, progress=Progress(20, 40, None, 0.2), start=start,
                       now=start + timedelta(seconds=100), running=False)
    assert ended is not None and ended["eta"] is None
    assert rows_chart(points=[], progress=Progress(0, 40, None, None), start=None,
                      now=start, running=False) is None


def test_the_billing_page_draws_spend_per_day_by_model(organization: Organization) -> None:
    owner, _ = signed_in(organization)
    chat = job_make(organization, status=JobStatus.DONE, model="gemma4-12b")
    embed = job_make(organization, status=JobStatus.DONE, model="all-minilm-l6-v2")
    key, _ = api_key_make(organization)
    for n, (job, cents) in enumerate([(chat, 7), (chat, 5), (embed, 3), (None, 2)]):
        LedgerEntry.objects.create(
            organization=organization, kind=EntryKind.CHARGE, balance_delta=-cents,
            job=job, api_key=key if job is None else None,
            idempotency_key=f"test:{n}:charge")
    days, spent = spend_per_day(organization=organization)
    today = timezone.localdate()
    assert len(days) == 30 and days[-1] == today
    assert spent == {(today, "gemma4-12b"): 12, (today, "all-minilm-l6-v2"): 3,
                     (today, REALTIME_SPEND): 2}
    response = owner.get("/console/billing")
    assert_strict(response, "billing")
    html = response.content.decode()
    assert 'id="spend-chart"' in html and "17 credits ($0.17) spent" in html
    # a bar segment per model, the busiest first, each in the legend with its total
    assert re.search(r'<rect [^>]*class="m0"><title>[^<]*, gemma4-12b: 12 credits', html)
    assert re.search(r'class="m1"><title>[^<]*, all-minilm-l6-v2: 3 credits', html)
    assert "realtime (all models) <strong>$0.02</strong>" in html
    # and the same as a table
    assert "<td data-label=\"Model\">gemma4-12b</td>" in html
