"""The admin's operations page in a real browser (Debian's chromium, driven by Playwright)
against a live server on the real PostgreSQL and Redis: a staff member who may view jobs
opens it and sees the fleet (queues with messages waiting, a live and a silent worker, a
running job with its rate and ETA, the oldest waiting chunk, failures by class), then the
job's read-only page with its history. Screenshots at desktop and phone widths go under
$ANEX_RUN_DIR/screenshots (git-ignored); no engine is needed."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from django.utils import timezone
from playwright.sync_api import Browser, expect

from jobs import dispatch
from jobs.failures import FailureClass, failure_note
from jobs.models import Job, WorkerHeartbeat
from jobs.services.running import job_start
from jobs.services.workers import worker_beat
from tests.browser.test_console_browser import DESKTOP, PHONE, browser, shoot  # noqa: F401
from tests.db.test_fair_dispatch import MODEL, approved_job, finish
from tests.dispatched import dispatch_catch
from tests.factories import organization_make

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def fleet(monkeypatch: pytest.MonkeyPatch, settings: Any) -> Job:
    """A fleet with something to show: messages waiting, workers, a running job."""
    import dramatiq

    settings.ANEX_CHUNK_ROWS = 10
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_DISPATCH_IN_FLIGHT = settings.ANEX_DISPATCH_JOB_IN_FLIGHT = 2
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "chunk_run_task")
    broker = dramatiq.get_broker()
    for queue in (dispatch.ESTIMATE, dispatch.WEBHOOKS):
        broker.declare_queue(queue)
    broker.flush_all()
    for _ in range(4):
        dispatch.send("job_estimate_task", str(uuid.uuid4()))
    dispatch.send("delivery_attempt_task", str(uuid.uuid4()), delay_ms=600_000)
    worker_beat(name="gpu-a100-1:4711", queues=[dispatch.run_queue("world", MODEL),
                                                 dispatch.sample_queue("world", MODEL)])
    WorkerHeartbeat.objects.filter(name="gpu-a100-1:4711").update(
        started_at=timezone.now() - timedelta(hours=5, minutes=12), served_models=[MODEL],
        engines_loaded=[MODEL], regions=["world"])
    worker_beat(name="cpu-2:913", queues=[dispatch.ESTIMATE, dispatch.INGEST])
    WorkerHeartbeat.objects.filter(name="cpu-2:913").update(
        beat_at=timezone.now() - timedelta(minutes=7),
        started_at=timezone.now() - timedelta(days=2), served_models=[], regions=["world"])
    job = approved_job(organization_make(name="Acme Research"), rows=60)
    job_start(job_id=job.pk)
    finish(sent[0])
    Job.objects.filter(pk=job.pk).update(approved_at=timezone.now() - timedelta(minutes=4))
    for failure in (FailureClass.INFRASTRUCTURE, FailureClass.INFRASTRUCTURE,
                    FailureClass.ENGINE):
        failure_note(failure)
    return job


def test_the_operations_page_in_a_browser(browser: Browser, live_server: Any,  # noqa: F811
                                          monkeypatch: pytest.MonkeyPatch,
                                          settings: Any) -> None:
    job = fleet(monkeypatch, settings)
    user = get_user_model().objects.create_user("support", email="support@example.com",
                                                is_staff=True)
    user.user_permissions.set(Permission.objects.filter(
        codename__in=["view_job", "view_chunk", "view_input"]))
    client = Client()
    client.force_login(user)
    cookie = client.cookies[django_settings.SESSION_COOKIE_NAME].value
    for viewport in (DESKTOP, PHONE):
        context = browser.new_context(viewport=viewport)
        context.add_cookies([{"name": django_settings.SESSION_COOKIE_NAME, "value": cookie,
                              "url": live_server.url}])
        page = context.new_page()
        page.goto(f"{live_server.url}/admin/")
        page.get_by_role("link", name="Operations", exact=True).click()
        expect(page.locator("h1")).to_have_text("Operations")
        expect(page.locator("#queues")).to_contain_text("estimate")
        expect(page.locator("#workers")).to_contain_text("gpu-a100-1:4711")
        expect(page.locator("#workers")).to_contain_text("silent")
        expect(page.locator("#running")).to_contain_text("Acme Research")
        expect(page.locator("#oldest")).to_contain_text(str(job.pk))
        expect(page.locator("#failures")).to_contain_text("infrastructure")
        shoot(page, "admin-operations")
        page.locator("#running").get_by_role("link", name=str(job.pk)).click()
        # Its history: the approval's event, by whom.
        history = page.locator(".inline-group")
        expect(history).to_contain_text("History (JobEvent)", ignore_case=True)
        expect(history).to_contain_text("system: tests")
        expect(history).to_contain_text("In Progress")
        shoot(page, "admin-job")
        context.close()
