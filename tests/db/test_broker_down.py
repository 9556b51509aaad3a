"""With the broker down, a submit and an approval answer 503 with Retry-After and change
nothing; a broker lost between the commit and the send leaves committed work that answers
its success and is sent again by the recovery pass, never a 500."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from datetime import timedelta

import dramatiq
import pytest
import redis
from django.utils import timezone
from dramatiq.brokers.redis import RedisBroker
from rest_framework.test import APIClient

from billing.services import credits_summary
from console.models import Organization
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.recovery import SUBMITTED
from tests.factories import input_ready, job_make

pytestmark = pytest.mark.django_db
JOBS = "/batch/v1/jobs"
CHAT_ROW = b'{"custom_id":"r1","method":"POST","url":"/v1/chat/completions","body":{}}\n'


@pytest.fixture
def broker_down(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The broker's Redis at an address where nothing listens (as when it is down)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    broker = dramatiq.get_broker()
    dead = redis.Redis(host="127.0.0.1", port=port, socket_connect_timeout=0.5)
    monkeypatch.setattr(broker, "client", dead)
    yield


def test_a_submit_with_the_broker_down_answers_503_and_creates_nothing(
        organization: Organization, api: APIClient, broker_down: None) -> None:
    item = input_ready(organization, CHAT_ROW)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "qwen3.8-27b",
                               "max_output_tokens": 600}, format="json")
    assert response.status_code == 503, response.content
    assert int(response["Retry-After"]) > 0
    assert "nothing was done" in response.json()["detail"]
    assert not Job.objects.filter(organization=organization).exists()


def test_an_approval_with_the_broker_down_answers_503_and_holds_nothing(
        organization: Organization, api: APIClient, broker_down: None) -> None:
    job = job_make(organization, est_cost_cents=50)
    before = credits_summary(organization=organization)
    response = api.post(f"{JOBS}/{job.pk}/approve")
    assert response.status_code == 503, response.content
    assert int(response["Retry-After"]) > 0
    job.refresh_from_db()
    assert job.status == JobStatus.COST_READY
    assert credits_summary(organization=organization) == before


def test_a_broker_lost_after_the_commit_answers_the_submit_and_recovery_sends_it(
        organization: Organization, api: APIClient, monkeypatch: pytest.MonkeyPatch,
        django_capture_on_commit_callbacks) -> None:  # type: ignore[no-untyped-def]
    from jobs import dispatch

    item = input_ready(organization, CHAT_ROW)

    def lost(*args: object, **kwargs: object) -> None:
        raise redis.ConnectionError("the broker went away after the commit")

    monkeypatch.setattr(dispatch, "send", lost)
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(JOBS, {"input_id": str(item.pk), "model": "qwen3.8-27b",
                                   "max_output_tokens": 600}, format="json")
    assert response.status_code == 200, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.status == JobStatus.SUBMITTED
    # Its estimate message is sent again by the recovery pass once the lease runs out.
    assert SUBMITTED.due(timezone.now() + timedelta(minutes=6)).filter(pk=job.pk).exists()


def test_the_broker_ping_is_retried_once_without_waiting(broker_down: None) -> None:
    """The broker's own client keeps redis-py's backed-off retries (a worker rides out a
    Redis restart on them); the ping before a submit or an approval does not: it held the
    request about 4 s before its 503."""
    from jobs.dispatch import _pinger_of

    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    pinger = _pinger_of(broker.client)
    retry = pinger.connection_pool.connection_kwargs["retry"]
    assert retry.get_retries() == 1
    assert pinger.connection_pool.connection_kwargs["port"] == \
        broker.client.connection_pool.connection_kwargs["port"]
    with pytest.raises(redis.ConnectionError):
        pinger.ping()
