"""Job webhooks (the reference, "Webhooks"): setting the endpoint, the secret and its
rotation, every event's envelope and payload, and delivery through the outbox - only a 2xx
counts, retries widen for about a day, order per job, nothing lost to a dead worker.

Every body is checked by a receiver that uses nothing but the `standardwebhooks` package
on the exact bytes it got."""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from itertools import pairwise
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, urlsplit

import dramatiq
import pytest
import standardwebhooks
from django.core import signing
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.utils import timezone
from pytest_django import Settings

from anex.net import no_reply, url_mask
from console.actors import Actor
from console.constants import Role
from console.models import AuditEvent, Organization
from console.selectors import organization_webhook_secret
from jobs.constants import DELIVERY_BACKOFF_SECONDS, DeliveryStatus, FailureCode, JobStatus
from jobs.models import Job, WebhookDelivery
from jobs.services.webhook_endpoint import (
    organization_webhook_secret_rotate,
    organization_webhook_set,
    organization_webhook_test,
)
from jobs.services.webhooks import deliveries_sweep, delivery_attempt, job_webhook_enqueue
from jobs.storage import DOWNLOAD_SALT, storage_for
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, api_key_make, job_make, organization_make, user_make
from tests.servers import LocalServer, Seen, _Handler, reply, tls_context
from tests.workers import running_worker

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00$")


# -- a receiver that knows only the standardwebhooks package ------------------------------

def verified(seen: Seen, secret: str) -> dict[str, Any]:
    """What a customer's receiver does: verify the raw body against the headers."""
    headers = {name.lower(): value for name, value in seen.headers.items()}
    event: dict[str, Any] = standardwebhooks.Webhook(secret).verify(seen.body, headers)
    assert set(event) == {"type", "timestamp", "id", "data"}
    assert event["id"] == headers["webhook-id"]
    assert ISO_MS.match(event["timestamp"]), event["timestamp"]
    return event


@pytest.fixture
def receiver(make_server: Callable[..., LocalServer], ca, trust_ca: None,  # type: ignore[no-untyped-def]
             loopback: None) -> LocalServer:
    """The customer's https endpoint, on loopback, with a certificate our test CA signed."""
    return make_server(tls=tls_context(ca, "127.0.0.1"))


def answering(receiver: LocalServer, *statuses: int) -> list[tuple[float, str, int]]:
    """Answer /hook with these statuses in turn, then 200; returns (when, id, status) of
    every request."""
    log: list[tuple[float, str, int]] = []
    queue = list(statuses)
    lock = threading.Lock()

    def route(handler: _Handler) -> None:
        with lock:
            status = queue.pop(0) if queue else 200
            log.append((time.monotonic(), handler.headers["webhook-id"], status))
        reply(handler, status, b"ok")

    receiver.routes["/hook"] = route
    return log


@pytest.fixture
def org_endpoint(receiver: LocalServer) -> tuple[Organization, str]:
    """An organization whose endpoint is the receiver; returns it and its secret."""
    organization = organization_webhook_set(organization=organization_make(), actor=SYSTEM,
                                            url=receiver.url("/hook"))
    secret = organization_webhook_secret(organization=organization)
    assert secret is not None
    return organization, secret


def hooks(receiver: LocalServer) -> list[Seen]:
    return [seen for seen in receiver.requests if seen.path == "/hook"]


def move(job: Job, status: JobStatus, **fields: Any) -> None:
    """What the state machine does: update the row, then call the hook in that transaction."""
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(status=status, **fields)
        job_webhook_enqueue(job=job, status=status)


def deliver_all() -> None:
    """Attempt every due delivery, oldest first, until none is left due."""
    while True:
        due = [d.pk for d in WebhookDelivery.objects.filter(
            status=DeliveryStatus.PENDING, next_attempt_at__lte=timezone.now()
        ).order_by("created_at")]
        if not any([delivery_attempt(delivery_id=pk) for pk in due]):
            return


def result_for(job: Job, content: bytes = b'{"custom_id":"a"}\n') -> str:
    key = f"results/{job.organization_id}/{job.pk}/result.jsonl"
    storage_for("world").write_stream(key, iter([content]), max_bytes=len(content) + 1)
    return key


# -- setting the endpoint -----------------------------------------------------------------

@pytest.mark.django_db
def test_setting_an_endpoint_gives_it_a_secret_encrypted_at_rest(receiver: LocalServer) -> None:
    organization = organization_make()
    owner = user_make(organization, role=Role.OWNER)
    organization_webhook_set(organization=organization, actor=Actor(user=owner),
                             url=receiver.url("/hook"))
    secret = organization_webhook_secret(organization=organization)
    assert secret is not None and secret.startswith("whsec_")
    stored = Organization.objects.get(pk=organization.pk)
    assert stored.webhook_url == receiver.url("/hook")
    assert secret not in stored.webhook_secret_encrypted
    event = AuditEvent.objects.for_org(organization).get(action="webhook.endpoint_set")
    # the record keeps the endpoint's host only (issue 22 L9)
    assert event.data == {"from": "", "to": url_mask(receiver.url("/hook"))}
    assert event.actor_user == owner
    # Setting it again (or another URL) keeps the secret the receiver already has.
    organization_webhook_set(organization=organization, actor=SYSTEM,
                             url=receiver.url("/other"))
    assert organization_webhook_secret(organization=organization) == secret


@pytest.mark.django_db
@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8443/hook",  # http, even where the fetcher may use loopback http
    "https://10.0.0.5/hook",
    "https://169.254.169.254/latest/meta-data",
    "https://[::ffff:127.0.0.1]/hook",
    "https://100.64.0.1/hook",
    "https://user:pw@example.com/hook",
])
def test_http_and_private_endpoints_are_refused_when_set(url: str, loopback: None) -> None:
    organization = organization_make()
    with pytest.raises(ValidationError):
        organization_webhook_set(organization=organization, actor=SYSTEM, url=url)
    stored = Organization.objects.get(pk=organization.pk)
    assert (stored.webhook_url, stored.webhook_secret_encrypted) == ("", "")
    assert not AuditEvent.objects.for_org(organization).filter(
        action="webhook.endpoint_set").exists()


@pytest.mark.django_db
def test_loopback_is_refused_outside_tests() -> None:
    with pytest.raises(ValidationError, match="not a public internet address"):
        organization_webhook_set(organization=organization_make(), actor=SYSTEM,
                                 url="https://127.0.0.1/hook")


@pytest.mark.django_db
def test_only_an_owner_changes_the_webhook_settings(receiver: LocalServer) -> None:
    organization = organization_make()
    member = Actor(user=user_make(organization, role=Role.MEMBER))
    key = Actor(key=api_key_make(organization)[0])
    outsider = Actor(user=user_make(organization_make(), role=Role.OWNER))
    for actor in (member, key, outsider):
        with pytest.raises(PermissionDenied):
            organization_webhook_set(organization=organization, actor=actor,
                                     url=receiver.url("/hook"))
        with pytest.raises(PermissionDenied):
            organization_webhook_secret_rotate(organization=organization, actor=actor)
        with pytest.raises(PermissionDenied):
            organization_webhook_test(organization=organization, actor=actor)
    assert Organization.objects.get(pk=organization.pk).webhook_url == ""


@pytest.mark.django_db
def test_the_test_event_is_signed_and_carries_the_shared_envelope(
        receiver: LocalServer, org_endpoint: tuple[Organization, str]) -> None:
    organization, secret = org_endpoint
    owner = user_make(organization, role=Role.OWNER)
    delivery = organization_webhook_test(organization=organization, actor=Actor(user=owner))
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.DELIVERED
    (seen,) = hooks(receiver)
    event = verified(seen, secret)
    assert (event["type"], event["data"]) == ("test", {"job_id": None})
    assert AuditEvent.objects.for_org(organization).filter(action="webhook.test_sent").exists()


@pytest.mark.django_db
def test_the_test_event_needs_an_endpoint() -> None:
    with pytest.raises(ValidationError, match="Set a webhook endpoint first"):
        organization_webhook_test(organization=organization_make(), actor=SYSTEM)


@pytest.mark.django_db
def test_a_rotated_secret_keeps_signing_beside_the_new_one_for_24_hours(
        receiver: LocalServer, org_endpoint: tuple[Organization, str],
        caplog: pytest.LogCaptureFixture) -> None:
    organization, old = org_endpoint
    caplog.set_level(logging.DEBUG)
    new = organization_webhook_secret_rotate(organization=organization, actor=SYSTEM)
    assert new != old and organization_webhook_secret(organization=organization) == new
    stored = Organization.objects.get(pk=organization.pk)
    assert stored.webhook_secret_previous_until is not None
    assert timedelta(hours=23, minutes=59) < stored.webhook_secret_previous_until - \
        timezone.now() <= timedelta(hours=24)

    first = organization_webhook_test(organization=organization, actor=SYSTEM)
    delivery_attempt(delivery_id=first.pk)
    (seen,) = hooks(receiver)
    assert len(seen.headers["webhook-signature"].split(" ")) == 2
    verified(seen, old)  # a receiver not yet switched
    verified(seen, new)  # and one already switched

    # After the grace period only the new secret signs.
    Organization.objects.filter(pk=organization.pk).update(
        webhook_secret_previous_until=timezone.now() - timedelta(seconds=1))
    second = organization_webhook_test(organization=organization, actor=SYSTEM)
    delivery_attempt(delivery_id=second.pk)
    seen = hooks(receiver)[-1]
    verified(seen, new)
    with pytest.raises(standardwebhooks.WebhookVerificationError):
        verified(seen, old)
    rotated = AuditEvent.objects.for_org(organization).get(action="webhook.secret_rotated")
    assert old not in json.dumps(rotated.data) and new not in json.dumps(rotated.data)
    assert old not in caplog.text and new not in caplog.text


# -- events and their payloads ------------------------------------------------------------

@pytest.mark.django_db
def test_every_event_of_a_job_that_runs_to_done(receiver: LocalServer,
                                                 org_endpoint: tuple[Organization, str]) -> None:
    organization, secret = org_endpoint
    job = job_make(organization, status=JobStatus.SUBMITTED, est_cost_cents=None)
    move(job, JobStatus.SUBMITTED)
    move(job, JobStatus.ESTIMATING)
    move(job, JobStatus.COST_READY, est_input_tok=1200, est_output_tok=800, est_cost_cents=7)
    move(job, JobStatus.IN_PROGRESS)
    move(job, JobStatus.FINALIZING)  # sends nothing
    move(job, JobStatus.DONE, result_key=result_for(job), partial=False)
    deliver_all()
    events = [verified(seen, secret) for seen in hooks(receiver)]
    job_id = str(job.pk)
    assert [e["type"] for e in events] == ["submitted", "estimating", "cost_ready",
                                           "in_progress", "completed"]
    assert [e["data"] for e in events[:4]] == [
        {"job_id": job_id}, {"job_id": job_id},
        {"job_id": job_id, "est_input_tok": 1200, "est_output_tok": 800, "est_cost_cents": 7,
         "priority": "standard"},
        {"job_id": job_id}]
    completed = events[4]["data"]
    assert list(completed) == ["job_id", "status", "result_url", "result_expires_in"]
    assert (completed["status"], completed["result_expires_in"]) == ("done", 3600)
    assert "/download/" in completed["result_url"]
    assert len({e["id"] for e in events}) == 5


@pytest.mark.django_db
def test_failed_and_cancelled_carry_status_partial_failure_and_a_link_only_if_any(
        receiver: LocalServer, org_endpoint: tuple[Organization, str]) -> None:
    organization, secret = org_endpoint
    failed = job_make(organization, status=JobStatus.ESTIMATING)
    move(failed, JobStatus.FAILED, partial=False, failure_code=FailureCode.INVALID_INPUT,
         failure_reason="Row 3 is not valid JSON.")
    cancelled = job_make(organization, status=JobStatus.IN_PROGRESS)
    move(cancelled, JobStatus.CANCELLING)  # sends nothing
    move(cancelled, JobStatus.CANCELLED, partial=True, result_key=result_for(cancelled))
    deliver_all()
    by_job = {e["data"]["job_id"]: e for e in (verified(s, secret) for s in hooks(receiver))}
    assert len(hooks(receiver)) == 2
    assert by_job[str(failed.pk)]["type"] == "failed"
    assert by_job[str(failed.pk)]["data"] == {
        "job_id": str(failed.pk), "status": "failed", "partial": False,
        "failure_code": "invalid_input", "failure_reason": "Row 3 is not valid JSON."}
    data = by_job[str(cancelled.pk)]["data"]
    assert by_job[str(cancelled.pk)]["type"] == "cancelled"
    assert {k: v for k, v in data.items() if k != "result_url"} == {
        "job_id": str(cancelled.pk), "status": "cancelled", "partial": True,
        "result_expires_in": 3600}
    assert "/download/" in data["result_url"]


@pytest.mark.django_db
def test_no_endpoint_records_nothing(organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.SUBMITTED)
    move(job, JobStatus.SUBMITTED)
    assert not WebhookDelivery.objects.exists()


@pytest.mark.django_db
def test_the_result_link_is_made_at_each_attempt(receiver: LocalServer,
                                                 org_endpoint: tuple[Organization, str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    organization, secret = org_endpoint
    answering(receiver, 503)
    job = job_make(organization, status=JobStatus.FINALIZING)
    move(job, JobStatus.DONE, result_key=result_for(job))
    delivery = WebhookDelivery.objects.get(job=job)
    assert "result_url" not in delivery.payload["data"]  # never stored: it expires
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.PENDING
    # The retry comes a day later: its link must still be good for its full hour.
    later = timezone.now() + timedelta(days=1)
    monkeypatch.setattr("jobs.storage.timezone", SimpleNamespace(now=lambda: later))
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.DELIVERED
    first, second = (verified(seen, secret) for seen in hooks(receiver))
    assert first["id"] == second["id"] == delivery.payload["id"]

    def expires(event: dict[str, Any]) -> int:
        token = parse_qs(urlsplit(event["data"]["result_url"]).query)["token"][0]
        return int(signing.loads(token, salt=DOWNLOAD_SALT)["expires"])

    assert expires(second) - expires(first) == pytest.approx(86400, abs=5)


# -- delivery -----------------------------------------------------------------------------

@pytest.mark.django_db
def test_a_jobs_later_event_waits_until_the_earlier_one_is_settled(
        receiver: LocalServer, org_endpoint: tuple[Organization, str],
        monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    organization, _secret = org_endpoint
    answering(receiver, 500)
    job, other = (job_make(organization, status=JobStatus.SUBMITTED) for _ in range(2))
    move(job, JobStatus.SUBMITTED)
    move(job, JobStatus.ESTIMATING)
    move(other, JobStatus.SUBMITTED)
    first, second = WebhookDelivery.objects.filter(job=job).order_by("created_at")
    assert delivery_attempt(delivery_id=first.pk) == DeliveryStatus.PENDING
    # Due, but the earlier event of its job is still pending: not attempted, not swept.
    assert delivery_attempt(delivery_id=second.pk) is None
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "delivery_attempt_task")
    WebhookDelivery.objects.filter(pk=first.pk).update(
        next_attempt_at=timezone.now() - timedelta(minutes=1))
    WebhookDelivery.objects.filter(job__in=[job, other]).exclude(pk=first.pk).update(
        next_attempt_at=timezone.now() - timedelta(minutes=1))
    assert deliveries_sweep() == 2
    assert str(second.pk) not in sent and str(first.pk) in sent  # the other job is not held
    # Once the first is delivered, the second is sent after that commit.
    kicked: list[tuple[str, ...]] = []
    dispatch_catch(monkeypatch, lambda message: kicked.append(message.args),
                   "delivery_attempt_task")
    with django_capture_on_commit_callbacks(execute=True):
        assert delivery_attempt(delivery_id=first.pk) == DeliveryStatus.DELIVERED
    assert kicked == [(str(second.pk),)]
    assert delivery_attempt(delivery_id=second.pk) == DeliveryStatus.DELIVERED
    assert [s.headers["webhook-id"] for s in hooks(receiver)][-2:] == [
        first.payload["id"], second.payload["id"]]


@pytest.mark.django_db
def test_500_three_times_then_200_delivers_each_event_once_on_widening_gaps(
        receiver: LocalServer, org_endpoint: tuple[Organization, str]) -> None:
    organization, secret = org_endpoint
    log = answering(receiver, 500, 500, 500)
    job = job_make(organization, status=JobStatus.SUBMITTED)
    for status in (JobStatus.SUBMITTED, JobStatus.ESTIMATING, JobStatus.COST_READY):
        move(job, status)
    gaps: list[float] = []
    for _ in range(20):  # the schedule, with the clock moved on instead of waited for
        deliver_all()
        waiting = WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING,
                                                 next_attempt_at__gt=timezone.now())
        if not waiting.exists():
            break
        for delivery in waiting:
            gaps.append((delivery.next_attempt_at - timezone.now()).total_seconds())
            WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert len(gaps) == 3 and gaps == sorted(gaps) and gaps[0] < gaps[1] < gaps[2]
    for gap, planned in zip(gaps, DELIVERY_BACKOFF_SECONDS, strict=False):
        assert planned * 0.89 <= gap <= planned * 1.1
    ok = [webhook_id for _when, webhook_id, status in log if status == 200]
    deliveries = list(WebhookDelivery.objects.filter(job=job).order_by("created_at"))
    assert ok == [d.payload["id"] for d in deliveries]  # each once, in order
    assert [d.attempts for d in deliveries] == [4, 1, 1]
    assert all(d.status == DeliveryStatus.DELIVERED for d in deliveries)
    for seen in hooks(receiver):
        verified(seen, secret)


@pytest.mark.django_db
def test_a_receiver_that_never_answers_is_given_up_after_about_a_day(
        receiver: LocalServer, org_endpoint: tuple[Organization, str],
        monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    organization, _secret = org_endpoint
    # Each of its ten attempts waits this long for a reply (every failure before one is the
    # same no_reply, however early it comes).
    monkeypatch.setattr("jobs.services.webhooks.READ_TIMEOUT_SECONDS", 0.05)

    def never_answer(handler: _Handler) -> None:
        receiver.release.wait(5)

    receiver.routes["/hook"] = never_answer
    job = job_make(organization, status=JobStatus.SUBMITTED)
    move(job, JobStatus.SUBMITTED)
    move(job, JobStatus.ESTIMATING)
    first, second = WebhookDelivery.objects.filter(job=job).order_by("created_at")
    waited = 0.0
    outcome = None
    kicked: list[tuple[str, ...]] = []
    dispatch_catch(monkeypatch, lambda message: kicked.append(message.args),
                   "delivery_attempt_task")
    for _ in range(len(DELIVERY_BACKOFF_SECONDS) + 1):
        with django_capture_on_commit_callbacks(execute=True):
            outcome = delivery_attempt(delivery_id=first.pk)
        first.refresh_from_db()
        if outcome == DeliveryStatus.PENDING:
            waited += (first.next_attempt_at - timezone.now()).total_seconds()
            WebhookDelivery.objects.filter(pk=first.pk).update(next_attempt_at=timezone.now())
    assert outcome == DeliveryStatus.GAVE_UP
    assert first.attempts == len(DELIVERY_BACKOFF_SECONDS) + 1
    assert first.last_error == no_reply("127.0.0.1")
    assert 0.9 * sum(DELIVERY_BACKOFF_SECONDS) <= waited <= 1.1 * sum(DELIVERY_BACKOFF_SECONDS)
    assert 20 <= waited / 3600 <= 25  # "about a day"
    # Given up, it no longer holds back the job's next event.
    assert kicked[-1] == (str(second.pk),)
    assert delivery_attempt(delivery_id=first.pk) is None


@pytest.mark.django_db
def test_endpoints_are_checked_again_when_delivering(
        receiver: LocalServer, org_endpoint: tuple[Organization, str],
        settings: Settings) -> None:
    organization, _secret = org_endpoint
    delivery = organization_webhook_test(organization=organization, actor=SYSTEM)
    # The name now answers with an address we refuse (here: loopback, outside tests).
    settings.ANEX_FETCH_ALLOW_LOOPBACK = False
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.PENDING
    delivery.refresh_from_db()
    assert delivery.last_error == "127.0.0.1 is not a public internet address"
    # An http endpoint saved before the check existed is refused too, even on loopback.
    settings.ANEX_FETCH_ALLOW_LOOPBACK = True
    http_url = receiver.url("/hook").replace("https://", "http://")
    Organization.objects.filter(pk=organization.pk).update(webhook_url=http_url)
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.PENDING
    delivery.refresh_from_db()
    assert delivery.last_error == "only https URLs are allowed"
    assert hooks(receiver) == []


@pytest.mark.django_db
def test_retries_go_to_the_endpoint_as_it_is_now(receiver: LocalServer,
                                                  org_endpoint: tuple[Organization, str]
                                                  ) -> None:
    organization, secret = org_endpoint
    answering(receiver, 404)
    delivery = organization_webhook_test(organization=organization, actor=SYSTEM)
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.PENDING
    organization_webhook_set(organization=organization, actor=SYSTEM,
                             url=receiver.url("/fixed"))
    WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.DELIVERED
    assert [s.path for s in receiver.requests] == ["/hook", "/fixed"]
    verified(receiver.requests[-1], secret)


# -- through the broker and a real worker -------------------------------------------------

@pytest.fixture
def broker() -> Iterator[dramatiq.Broker]:
    broker = dramatiq.get_broker()
    broker.flush_all()
    yield broker
    broker.flush_all()


def until(done: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        time.sleep(0.02)
    assert done(), "timed out"


@pytest.mark.django_db(transaction=True)
def test_through_the_broker_500_three_times_then_200_on_widening_gaps(
        receiver: LocalServer, org_endpoint: tuple[Organization, str],
        broker: dramatiq.Broker, monkeypatch: pytest.MonkeyPatch) -> None:
    organization, secret = org_endpoint
    # The schedule's shape, in seconds instead of hours: each gap at least 0.5 s longer than
    # the one before it, whatever the jitter (10 %), for the worker's delays on a busy machine.
    monkeypatch.setattr("jobs.services.webhooks.DELIVERY_BACKOFF_SECONDS", (0.2, 0.8, 1.6, 6.0))
    log = answering(receiver, 500, 500, 500)
    job = job_make(organization, status=JobStatus.SUBMITTED)
    with running_worker(threads=2):
        move(job, JobStatus.SUBMITTED)
        move(job, JobStatus.ESTIMATING)
        until(lambda: WebhookDelivery.objects.filter(
            job=job, status=DeliveryStatus.DELIVERED).count() == 2)
    first_id = WebhookDelivery.objects.filter(job=job).order_by("created_at")[0].payload["id"]
    times = [when for when, webhook_id, _status in log if webhook_id == first_id]
    gaps = [b - a for a, b in pairwise(times)]
    assert len(gaps) == 3 and gaps[0] < gaps[1] < gaps[2], gaps
    ok = [(webhook_id, status) for _when, webhook_id, status in log if status == 200]
    assert [webhook_id for webhook_id, _ in ok] == [
        d.payload["id"] for d in WebhookDelivery.objects.filter(job=job).order_by("created_at")]
    for seen in hooks(receiver):
        verified(seen, secret)


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_schedule_loses_nothing(
        receiver: LocalServer, org_endpoint: tuple[Organization, str],
        broker: dramatiq.Broker) -> None:
    organization, secret = org_endpoint
    log = answering(receiver, 500)
    job = job_make(organization, status=JobStatus.SUBMITTED)
    with running_worker():
        move(job, JobStatus.SUBMITTED)
        until(lambda: len(log) == 1)  # the first attempt failed; a retry is scheduled
    delivery = WebhookDelivery.objects.get(job=job)
    until(lambda: WebhookDelivery.objects.get(pk=delivery.pk).last_status_code == 500)
    # The worker and the broker go down: every queued and delayed message is gone.
    broker.flush_all()
    # A second event, recorded while its message is lost too (commit, then the process
    # died before sending): simulated by dropping the message again.
    move(job, JobStatus.ESTIMATING)
    broker.flush_all()
    # A third delivery was mid-attempt when its worker was killed: leased, never settled.
    other = job_make(organization, status=JobStatus.SUBMITTED)
    move(other, JobStatus.SUBMITTED)
    broker.flush_all()
    leased = WebhookDelivery.objects.get(job=other)
    WebhookDelivery.objects.filter(pk=leased.pk).update(
        attempts=1, leased_until=timezone.now() + timedelta(minutes=1))
    # Time passes: the retry is due, and the dead worker's lease runs out.
    long_ago = timezone.now() - timedelta(minutes=5)
    WebhookDelivery.objects.update(next_attempt_at=long_ago)
    assert deliveries_sweep() == 1  # the head of each job's queue that is not leased
    WebhookDelivery.objects.filter(pk=leased.pk).update(leased_until=long_ago)
    with running_worker(threads=2):
        assert deliveries_sweep() >= 1
        until(lambda: not WebhookDelivery.objects.filter(
            status=DeliveryStatus.PENDING).exists())
    deliveries = WebhookDelivery.objects.order_by("created_at")
    assert all(d.status == DeliveryStatus.DELIVERED for d in deliveries)
    ok = [webhook_id for _when, webhook_id, status in log if status == 200]
    assert sorted(ok) == sorted(d.payload["id"] for d in deliveries)  # each exactly once
    assert ok.index(deliveries[0].payload["id"]) < ok.index(deliveries[1].payload["id"])
    for seen in hooks(receiver):
        verified(seen, secret)


def test_the_schedule_widens_for_about_a_day() -> None:
    gaps = list(DELIVERY_BACKOFF_SECONDS)
    # Wider each time by more than the +-10% jitter can undo.
    assert all(later * 0.9 > earlier * 1.1 for earlier, later in pairwise(gaps))
    assert 20 <= sum(gaps) / 3600 <= 25


# -- issue 22, L9: records keep a webhook URL's host, never the rest -----------------------

def test_a_url_is_masked_to_its_scheme_host_and_port() -> None:
    assert url_mask("https://hooks.example.com/services/T0/B0/XyZsecret?key=k#f") == \
        "https://hooks.example.com/…"
    assert url_mask("https://hooks.example.com:8443/") == "https://hooks.example.com:8443/"
    assert url_mask("https://[2001:db8::1]/t?k=1") == "https://[2001:db8::1]/…"
    assert (url_mask(""), url_mask("not a url")) == ("", "…")


@pytest.mark.django_db
def test_audit_events_and_delivery_rows_keep_no_secret_part_of_the_url(
        receiver: LocalServer, django_capture_on_commit_callbacks: Any,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A webhook URL is often its own credential (a token in the path or the query): the
    # audit log and the delivery rows, read by every owner and kept, held it in full.
    dispatch_catch(monkeypatch, lambda message: None, "delivery_attempt_task")
    secret_path = "/hook?token=s3cr3t-t0ken"
    receiver.routes["/hook"] = lambda handler: reply(handler, 200, b"ok")
    organization = organization_webhook_set(organization=organization_make(), actor=SYSTEM,
                                            url=receiver.url(secret_path))
    job = job_make(organization)
    move(job, JobStatus.COST_READY, est_cost_cents=5)
    deliver_all()
    # the event still reached the full URL
    assert [seen.path for seen in receiver.requests] == [secret_path]
    # and no record keeps its secret part
    delivery = WebhookDelivery.objects.get(organization=organization)
    assert delivery.status == DeliveryStatus.DELIVERED
    assert delivery.url == url_mask(receiver.url(secret_path)) and "s3cr3t" not in delivery.url
    for event in AuditEvent.objects.for_org(organization):
        assert "s3cr3t" not in json.dumps(event.data), event.action
