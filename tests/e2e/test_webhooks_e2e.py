"""Job webhooks end to end: real jobs on the real engines (MiniLM), through the real broker
and a real Dramatiq worker, each event POSTed to a local https receiver that verifies it
with nothing but the `standardwebhooks` package.

The three jobs of the issue: one that runs to done, one that fails its row checks, one
cancelled while running. Every event of each arrives verified, in order, exactly once."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import standardwebhooks
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from console.selectors import organization_webhook_secret
from jobs.constants import DeliveryStatus
from jobs.models import Job, WebhookDelivery
from jobs.services.webhook_endpoint import organization_webhook_set
from tests.engine_fixtures import checkpoint_dirs  # noqa: F401
from tests.factories import SYSTEM, api_key_make, input_ready, organization_make
from tests.servers import LocalServer, tls_context
from tests.workers import fresh_worker, until

pytestmark = pytest.mark.django_db(transaction=True)
JOBS = "/batch/v1/jobs"


def api_organization(api: APIClient) -> Organization:
    return api.organization  # type: ignore[attr-defined, no-any-return]


class Receiver:
    """A customer's endpoint: verify with standardwebhooks on the raw bytes, keep the event."""

    def __init__(self, server: LocalServer, secret: str) -> None:
        self.server = server
        self.webhook = standardwebhooks.Webhook(secret)

    def events(self, job_id: str) -> list[dict[str, Any]]:
        seen = []
        for request in self.server.requests:
            headers = {name.lower(): value for name, value in request.headers.items()}
            event = self.webhook.verify(request.body, headers)  # raises unless signed by us
            assert event["id"] == headers["webhook-id"]
            if event["data"].get("job_id") == job_id:
                seen.append(event)
        return seen


@pytest.fixture
def setup(settings: Settings, checkpoint_dirs: dict[str, Path], live_server,  # type: ignore[no-untyped-def]  # noqa: F811
          make_server: Callable[..., LocalServer], ca, trust_ca: None, loopback: None,
          ) -> Iterator[tuple[APIClient, Receiver]]:
    settings.ANEX_CHECKPOINTS = {"all-minilm-l6-v2": checkpoint_dirs["minilm"]}
    settings.ANEX_WORKER_MODELS = ["all-minilm-l6-v2"]
    settings.ANEX_CHUNK_ROWS = 2
    settings.ANEX_FREE_GRANT_CENTS = 10_000
    settings.ANEX_API_ORIGIN = live_server.url  # result links served by the test server
    server = make_server(tls=tls_context(ca, "127.0.0.1"))
    organization: Organization = organization_webhook_set(
        organization=organization_make(), actor=SYSTEM, url=server.url("/hooks/anex"))
    secret = organization_webhook_secret(organization=organization)
    assert secret is not None
    _key, plaintext = api_key_make(organization)
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    api.organization = organization  # type: ignore[attr-defined]
    with fresh_worker(threads=2):
        yield api, Receiver(server, secret)


def status(job_id: str) -> str:
    return Job.objects.get(pk=job_id).status


def embedding_rows(*texts: str) -> bytes:
    return b"".join(json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                                "body": {"input": text}}).encode() + b"\n"
                    for i, text in enumerate(texts))


def submit(api: APIClient, content: bytes) -> str:
    organization = api_organization(api)
    item = input_ready(organization, content)
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "all-minilm-l6-v2"},
                        format="json")
    assert response.status_code == 200, response.content
    return str(response.json()["id"])


def all_delivered(job_id: str, count: int) -> Callable[[], bool]:
    return lambda: WebhookDelivery.objects.filter(
        job_id=job_id, status=DeliveryStatus.DELIVERED).count() == count


def test_a_job_that_runs_to_done(setup: tuple[APIClient, Receiver]) -> None:
    api, receiver = setup
    job_id = submit(api, embedding_rows("a plain text string", "another one", "a third"))
    until(lambda: status(job_id) in ("cost_ready", "failed"))
    assert api.post(f"{JOBS}/{job_id}/approve").json()["status"] == "in_progress"
    until(lambda: status(job_id) in ("done", "failed", "cancelled"))
    until(all_delivered(job_id, 5), timeout=30)
    events = receiver.events(job_id)
    assert [e["type"] for e in events] == ["submitted", "estimating", "cost_ready",
                                           "in_progress", "completed"]
    job = Job.objects.get(pk=job_id)
    assert events[2]["data"] == {"job_id": job_id, "est_input_tok": job.est_input_tok,
                                 "est_output_tok": job.est_output_tok,
                                 "est_cost_cents": job.est_cost_cents,
                                 "priority": "standard"}
    completed = events[4]["data"]
    assert (completed["status"], completed["result_expires_in"]) == ("done", 3600)
    download = requests.get(completed["result_url"], timeout=30)  # the link works as sent
    assert download.status_code == 200 and len(download.content.splitlines()) == 3


def test_a_job_that_fails_its_row_checks(setup: tuple[APIClient, Receiver]) -> None:
    api, receiver = setup
    job_id = submit(api, embedding_rows("fine") + b'{"custom_id": "bad", "method": "POST", '
                                                  b'"url": "/v1/embeddings", "body": {}}\n')
    until(lambda: status(job_id) in ("cost_ready", "failed"))
    assert status(job_id) == "failed"
    until(all_delivered(job_id, 3), timeout=30)
    events = receiver.events(job_id)
    assert [e["type"] for e in events] == ["submitted", "estimating", "failed"]
    job = Job.objects.get(pk=job_id)
    assert events[2]["data"] == {"job_id": job_id, "status": "failed", "partial": False,
                                 "failure_code": "invalid_input",
                                 "failure_reason": job.failure_reason}
    assert job.failure_reason  # the row check's own words


def test_a_job_cancelled_while_running(setup: tuple[APIClient, Receiver]) -> None:
    api, receiver = setup
    job_id = submit(api, embedding_rows(*(f"row number {i}" for i in range(40))))
    until(lambda: status(job_id) in ("cost_ready", "failed"))
    assert api.post(f"{JOBS}/{job_id}/approve").json()["status"] == "in_progress"
    assert api.post(f"{JOBS}/{job_id}/cancel").json()["status"] in ("cancelling", "cancelled")
    until(lambda: status(job_id) in ("done", "failed", "cancelled"))
    assert status(job_id) == "cancelled"
    until(all_delivered(job_id, 5), timeout=30)
    events = receiver.events(job_id)
    # cancelling sends nothing: the customer hears of the end, not the way there.
    assert [e["type"] for e in events] == ["submitted", "estimating", "cost_ready",
                                           "in_progress", "cancelled"]
    job = Job.objects.get(pk=job_id)
    data = events[4]["data"]
    assert (data["status"], data["partial"]) == ("cancelled", bool(job.partial))
    # A result URL exactly when there is something to download.
    assert ("result_url" in data) == bool(job.result_key)
