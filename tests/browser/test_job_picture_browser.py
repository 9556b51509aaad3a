"""The job as a picture in a real browser (Debian's chromium, driven by Playwright) against
a live server on the real PostgreSQL and Redis (issue 44 item 3): a job runs through the
real pipeline (submit, estimate, approval, each chunk on the worker's path with the chat
engine replaced and a real HTTPS media host answering 429 and 404, the finalize), and its
page draws rows over time with the ETA while it runs, then the ended job; an error's link
opens its rows; the Billing page draws spend per day by model. No page reports a Content-
Security-Policy violation or a script error.

Screenshots at 1280 and 375 px wide go under $ANEX_RUN_DIR/screenshots/picture (git-ignored,
so a test run leaves the tree as it was); ANEX_SCREENSHOTS_DIR=docs/console-screenshots
renews the committed ones that docs/dev/decisions/2026-12-06-the-job-as-a-picture.md
shows, to be looked at before they are committed."""

from __future__ import annotations

import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.db.models import F
from django.utils import timezone
from PIL import Image
from playwright.sync_api import Browser, Page, ViewportSize, expect
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_grant
from console.models import Organization
from inference.kinds import media as kinds_media
from jobs.constants import JobStatus
from jobs.models import Chunk, Job
from jobs.services.running import job_finalize
from tests.browser.test_console_browser import browser, csp_violations  # noqa: F401
from tests.db.test_console import signed_in
from tests.db.test_job_picture import (  # noqa: F401
    DAMAGED_GIF,
    LIMITED,
    RED,
    Run,
    engine,
    host,
    started,
)
from tests.db.test_media_serving import image
from tests.factories import SYSTEM, api_key_make, job_make
from tests.media import data_uri, picture
from tests.servers import LocalServer

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]
SHOTS = Path(os.environ.get("ANEX_SCREENSHOTS_DIR") or
             Path(os.environ.get("ANEX_RUN_DIR", ".run")) / "screenshots" / "picture")
DESKTOP: ViewportSize = {"width": 1280, "height": 900}
PHONE: ViewportSize = {"width": 375, "height": 812}
ROWS, CHUNK_ROWS = 48, 4


def shoot(page: Page, name: str, bottom: str) -> None:
    """The page from its top to the end of `bottom` (a selector): small PNGs of what the
    note shows, not the job's every field."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    width = page.viewport_size["width"] if page.viewport_size else 0
    end = page.evaluate("selector => document.querySelector(selector)"
                        ".getBoundingClientRect().bottom + window.scrollY", bottom)
    suffix = "phone" if width < 600 else "desktop"
    path = SHOTS / f"{name}-{suffix}.png"
    page.screenshot(path=str(path), full_page=True,
                    clip={"x": 0, "y": 0, "width": width, "height": end + 16})
    # A palette of 256 colours: a third of the bytes, the same picture to the eye.
    Image.open(path).convert("RGB").quantize(colors=256).save(path, optimize=True)


def drawn_width(page: Page, selector: str) -> float:
    """The element's width as drawn, read in one turn of the page's script (the live part
    is redrawn by its poller: an element found in one call may be gone by the next)."""
    return float(page.evaluate(
        "selector => document.querySelector(selector).getBoundingClientRect().width",
        selector))


def watched(page: Page) -> list[str]:
    """Every CSP violation and script error the page reports, from now on."""
    seen = csp_violations(page)
    # The site has no favicon: the browser's own request for one is not the page's.
    page.on("console", lambda message: seen.append(message.text)
            if message.type == "error"
            and not message.location.get("url", "").endswith("/favicon.ico") else None)
    page.on("pageerror", lambda error: seen.append(str(error)))
    return seen


def spaced(run: Run, count: int, approved: Any, every: int) -> None:
    """Run `count` more chunks (as their messages are sent: fair dispatch sends more as
    chunks settle), each recorded as finished `every` seconds after the one before (from
    approval), as a job's chunks finish over minutes."""
    for _ in range(count):
        chunk_id = run.chunk_ids[0]
        run.chunks(1)
        done = Chunk.objects.filter(job=run.job, finished_at__isnull=False).count()
        Chunk.objects.filter(pk=chunk_id).update(
            finished_at=approved + timedelta(seconds=every * done))


def charges_over_the_month(organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    """Other models' charges on earlier days (the ledger is append-only: each is written
    on the day it is dated, as the clock says then)."""
    credits_grant(organization=organization, cents=2_000, reason="a top-up", actor=SYSTEM)
    key, _ = api_key_make(organization)
    jobs = {model: job_make(organization, status=JobStatus.DONE, model=model)
            for model in ("gemma4-12b", "qwen3-embedding-8b", "all-minilm-l6-v2")}
    now = timezone.now()
    plan = [(20, "gemma4-12b", 140), (20, "all-minilm-l6-v2", 30), (14, "qwen3-embedding-8b", 90),
            (9, "gemma4-12b", 60), (9, None, 25), (5, "qwen3-embedding-8b", 45),
            (2, "gemma4-12b", 210), (2, "all-minilm-l6-v2", 20), (1, None, 40)]
    for n, (days_ago, model, cents) in enumerate(plan):
        with monkeypatch.context() as clock:
            clock.setattr(timezone, "now", lambda days=days_ago: now - timedelta(days=days))
            LedgerEntry.objects.create(
                organization=organization, kind=EntryKind.CHARGE, balance_delta=-cents,
                job=jobs[model] if model else None, api_key=None if model else key,
                idempotency_key=f"picture:{organization.pk}:{n}")


def test_the_job_page_draws_the_job_while_it_runs_and_after_it_ends(
        browser: Browser, live_server: Any, api: APIClient,  # noqa: F811
        organization: Organization, settings: Settings, checkpoints: Any,
        engine: Any, host: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_CHUNK_ROWS = CHUNK_ROWS
    # Chunks of rows in file order, so the failed rows are spread over the run (a grouped
    # plan puts rows with the same image side by side).
    settings.ANEX_GROUP_ROWS = False
    monkeypatch.setattr(kinds_media, "FETCH_RETRY_SECONDS", (0.01, 0.01))
    monkeypatch.setattr("console.views.jobs.POLL_MS", 300)
    red = data_uri(picture(RED), "image/png")
    parts = [image(red) for _ in range(ROWS)]
    for index in (5, 17, 18, 30, 41):
        parts[index] = image(host.url("/limited.png"))
    parts[11] = image(host.url("/gone.png"))
    parts[26] = image(data_uri(DAMAGED_GIF, "image/gif"))
    run = started(api, organization, parts, monkeypatch)
    # Seven of its twelve chunks finished a minute apart since approval, 7.5 minutes ago.
    approved = timezone.now() - timedelta(minutes=7.5)
    Job.objects.filter(pk=run.job.pk).update(approved_at=approved)
    spaced(run, 7, approved, every=60)
    charges_over_the_month(organization, monkeypatch)

    client, _ = signed_in(organization)
    cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    job_url = f"{live_server.url}/console/jobs/{run.job.pk}"
    contexts = {}
    for viewport in (DESKTOP, PHONE):
        context = browser.new_context(viewport=viewport)
        context.add_cookies([{"name": django_settings.SESSION_COOKIE_NAME, "value": cookie,
                              "url": live_server.url}])
        contexts[viewport["width"]] = context

    # While it runs: rows over time with the ETA, the outcomes so far, the cost so far.
    for width, context in contexts.items():
        page = context.new_page()
        refused = watched(page)
        page.goto(job_url)
        expect(page.locator("[data-status]")).to_have_attribute("data-status", "in_progress")
        chart = page.locator("#rows-chart svg")
        expect(chart).to_be_visible()
        assert page.locator("#rows-chart path.area-finished").count() == 1
        expect(page.locator("#rows-chart line.line-eta")).to_have_count(1)
        expect(page.locator("#rows-chart figcaption")).to_contain_text("at this pace")
        expect(page.locator("#outcomes-chart svg rect")).not_to_have_count(0)
        expect(page.locator("#cost-chart rect.spent")).to_have_count(1)
        expect(page.locator("#cost-chart figcaption")).to_contain_text("so far")
        expect(page.locator("#tier")).to_have_text("Standard")
        drawn = drawn_width(page, "#rows-chart svg")
        assert drawn >= width * 0.7, drawn  # it fills the width
        shoot(page, "job-running", "section.picture")
        page.close()
        assert refused == [], refused

    # The page keeps drawing as it runs (its poller), and stops with the job.
    page = contexts[DESKTOP["width"]].new_page()
    refused = watched(page)
    page.goto(job_url)
    # The rest a minute apart too, the job ending after the last (all moved back in time,
    # the last before now).
    shift = timedelta(minutes=5.5)
    approved -= shift
    Job.objects.filter(pk=run.job.pk).update(approved_at=approved)
    Chunk.objects.filter(job=run.job, finished_at__isnull=False).update(
        finished_at=F("finished_at") - shift)
    spaced(run, ROWS // CHUNK_ROWS - 7, approved, every=60)
    assert run.chunk_ids == []
    assert job_finalize(job_id=run.job.pk) == JobStatus.DONE
    expect(page.locator("[data-status]")).to_have_attribute("data-status", "done",
                                                            timeout=15_000)
    expect(page.locator("#rows-chart line.line-eta")).to_have_count(0)
    expect(page.locator("#rows-chart figcaption")).to_contain_text(
        f"{ROWS} of {ROWS} rows done when the job ended")
    expect(page.locator("#cost-chart figcaption")).to_contain_text("Charged")
    page.close()
    assert refused == [], refused

    for width, context in contexts.items():
        page = context.new_page()
        refused = watched(page)
        page.goto(job_url)
        expect(page.locator("#rows-chart path.area-failed")).to_have_count(1)
        shoot(page, "job-ended", "section.picture")
        # an error's link opens its rows
        page.locator("#outcomes-chart").get_by_role("link", name=LIMITED).click()
        expect(page.get_by_role("heading", name=re.compile("Rows that failed with"))) \
            .to_be_visible()
        expect(page.locator("table.error-rows tbody tr")).to_have_count(5)
        expect(page.locator("table.error-rows")).to_contain_text("the host answered HTTP 429")
        expect(page.locator("table.error-rows")).to_contain_text("row-17")
        shoot(page, "job-error-rows", "table.error-rows")
        # the Billing page: spend per day by model
        page.goto(f"{live_server.url}/console/billing")
        expect(page.locator("#spend-chart svg")).to_be_visible()
        expect(page.locator("#spend-chart .legend li")).to_have_count(4)
        expect(page.locator("#spend-chart svg rect.m0")).not_to_have_count(0)
        drawn = drawn_width(page, "#spend-chart svg")
        assert drawn >= width * 0.65, drawn  # beside its axis labels
        shoot(page, "billing", "#spend-chart")
        page.close()
        assert refused == [], refused
    for context in contexts.values():
        context.close()
