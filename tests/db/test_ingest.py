"""POST /inputs in ingest mode: the size probe, the streamed copy by the input_copy_task actor
through the SSRF-safe fetcher, and the signed input.ready / input.failed callbacks."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
import standardwebhooks
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from anex.crypto import secret_decrypt
from anex.net import no_reply
from jobs.constants import DELIVERY_BACKOFF_SECONDS, DeliveryStatus, InputStatus
from jobs.models import Input, WebhookDelivery
from jobs.services.inputs import input_copy
from jobs.services.recovery import inputs_sweep
from jobs.services.webhooks import delivery_attempt, webhook_signature
from jobs.storage import storage_for
from tests.dispatched import dispatch_catch
from tests.servers import LocalServer, _Handler, reply, tls_context
from tests.workers import broker_flush, running_worker

INPUTS = "/batch/v1/inputs"
ROWS = b'{"custom_id":"row-1","method":"POST","url":"/v1/chat/completions","body":{}}\n' * 50


@pytest.fixture
def source(make_server: Callable[..., LocalServer], ca, trust_ca: None,  # type: ignore[no-untyped-def]
           loopback: None) -> LocalServer:
    """The customer's https host, on loopback, with a certificate our test CA signed."""
    return make_server(tls=tls_context(ca, "127.0.0.1"))


def serve(server: LocalServer, path: str, body: bytes, status: int = 200,
          advertise: bool = True) -> str:
    server.routes[path] = lambda handler: reply(handler, status, body, advertise=advertise)
    return server.url(path)


def ingest(api: APIClient, **body: str) -> dict:  # type: ignore[type-arg]
    response = api.post(INPUTS, body, format="json")
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


@pytest.mark.django_db
def test_ingest_copies_the_source_and_the_input_becomes_ready(api: APIClient,
                                                              source: LocalServer) -> None:
    url = serve(source, "/in.jsonl", ROWS)
    created = ingest(api, source_url=url)
    assert created["status"] == "pending" and "callback_secret" not in created
    assert created["input_s3_uri"].endswith(f"/{created['id']}.jsonl")
    assert input_copy(input_id=created["id"]) == InputStatus.READY
    polled = api.get(f"{INPUTS}/{created['id']}").json()
    assert (polled["status"], polled["error"], polled["size_bytes"]) == ("ready", None, len(ROWS))
    item = Input.objects.get(pk=created["id"])
    with storage_for("world").open(item.object_key) as handle:
        assert handle.read() == ROWS
    assert item.source_url == ""  # it may carry the customer's credentials
    # A redelivered message finds nothing left to do.
    assert input_copy(input_id=created["id"]) is None


@pytest.mark.django_db
def test_a_source_advertising_more_than_the_cap_is_413_before_any_copy(
        api: APIClient, source: LocalServer, settings: Settings) -> None:
    settings.ANEX_INPUT_MAX_BYTES = 100
    url = serve(source, "/big.jsonl", ROWS)
    response = api.post(INPUTS, {"source_url": url}, format="json")
    assert response.status_code == 413
    assert response.json() == {"detail": f"The source advertises {len(ROWS):,} bytes, over "
                                         "the input cap of 100 bytes."}
    assert not Input.objects.exists()


@pytest.mark.django_db
def test_a_source_that_does_not_advertise_its_size_fails_during_the_copy(
        api: APIClient, source: LocalServer, settings: Settings) -> None:
    settings.ANEX_INPUT_MAX_BYTES = 100
    url = serve(source, "/big.jsonl", ROWS, advertise=False)
    created = ingest(api, source_url=url)
    assert input_copy(input_id=created["id"]) == InputStatus.FAILED
    polled = api.get(f"{INPUTS}/{created['id']}").json()
    assert polled["status"] == "failed"
    assert polled["error"] == "The source is larger than the input cap of 100 bytes."
    item = Input.objects.get(pk=created["id"])
    assert not storage_for("world").exists(item.object_key)


@pytest.mark.django_db
@pytest.mark.parametrize("status,body,error", [
    (404, b"missing", "The source answered HTTP 404."),
    (200, b"a,b\n1,2\n", "The file is not JSONL: its first line is not a JSON object."),
    (200, b"", "The file is empty."),
])
def test_a_copy_that_cannot_succeed_fails_with_the_reason(api: APIClient, source: LocalServer,
                                                          status: int, body: bytes,
                                                          error: str) -> None:
    created = ingest(api, source_url=serve(source, "/x.jsonl", body, status))
    assert input_copy(input_id=created["id"]) == InputStatus.FAILED
    assert api.get(f"{INPUTS}/{created['id']}").json()["error"] == error


@pytest.mark.django_db
def test_a_source_too_slow_to_answer_fails_the_copy(api: APIClient, source: LocalServer,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    def stall(handler: _Handler) -> None:
        source.release.wait(10)  # never answers while the copy waits

    source.routes["/slow.jsonl"] = lambda handler: reply(handler, 200, ROWS)
    created = ingest(api, source_url=source.url("/slow.jsonl"))
    source.routes["/slow.jsonl"] = stall
    monkeypatch.setattr("jobs.services.inputs.COPY_READ_TIMEOUT_SECONDS", 0.5)
    assert input_copy(input_id=created["id"]) == InputStatus.FAILED
    assert Input.objects.get(pk=created["id"]).error == no_reply("127.0.0.1")


@pytest.mark.django_db
@pytest.mark.parametrize("url", [
    "https://127.0.0.1/in.jsonl",  # loopback: not allowed outside tests
    "https://169.254.169.254/latest/meta-data",
    "https://10.0.0.5/in.jsonl",
])
def test_a_source_at_a_refused_address_is_400(api: APIClient, url: str) -> None:
    response = api.post(INPUTS, {"source_url": url}, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("source_url cannot be fetched:")
    assert not Input.objects.exists()


@pytest.fixture
def receiver(make_server: Callable[..., LocalServer], ca) -> LocalServer:  # type: ignore[no-untyped-def]
    return make_server(tls=tls_context(ca, "127.0.0.1"))


@pytest.mark.django_db
def test_a_callback_is_signed_with_the_ingests_own_secret(api: APIClient, source: LocalServer,
                                                         receiver: LocalServer) -> None:
    created = ingest(api, source_url=serve(source, "/in.jsonl", ROWS),
                     callback_url=receiver.url("/hooks/ingest"))
    secret = created["callback_secret"]
    assert secret.startswith("whsec_")
    item = Input.objects.get(pk=created["id"])
    assert secret not in item.callback_secret_encrypted  # encrypted at rest
    assert secret_decrypt(item.callback_secret_encrypted) == secret
    assert "callback_secret" not in api.get(f"{INPUTS}/{created['id']}").json()

    input_copy(input_id=created["id"])
    delivery = WebhookDelivery.objects.get(input=item)
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.DELIVERED

    (seen,) = [r for r in receiver.requests if r.path == "/hooks/ingest"]
    headers = {name.lower(): value for name, value in seen.headers.items()}
    # Verified with the Standard Webhooks reference implementation, on the exact bytes.
    payload = standardwebhooks.Webhook(secret).verify(seen.body, headers)
    assert payload["type"] == "input.ready"
    assert isinstance(payload["timestamp"], int)  # unix seconds, not a date string
    assert payload["id"] == headers["webhook-id"]
    assert payload["data"] == {"input_id": created["id"], "status": "ready",
                               "input_s3_uri": created["input_s3_uri"], "error": None}


@pytest.mark.django_db
def test_a_failed_ingest_calls_back_input_failed(api: APIClient, source: LocalServer,
                                                 receiver: LocalServer) -> None:
    created = ingest(api, source_url=serve(source, "/gone.jsonl", b"", 404),
                     callback_url=receiver.url("/hook"))
    input_copy(input_id=created["id"])
    delivery = WebhookDelivery.objects.get(input_id=created["id"])
    assert delivery.payload["type"] == "input.failed"
    assert delivery.payload["data"]["error"] == "The source answered HTTP 404."


@pytest.mark.django_db
def test_only_a_2xx_counts_and_failures_are_retried_then_given_up(
        api: APIClient, source: LocalServer, receiver: LocalServer) -> None:
    receiver.routes["/hook"] = lambda handler: reply(handler, 500, b"no")
    created = ingest(api, source_url=serve(source, "/in.jsonl", ROWS),
                     callback_url=receiver.url("/hook"))
    input_copy(input_id=created["id"])
    delivery = WebhookDelivery.objects.get(input_id=created["id"])
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.PENDING
    delivery.refresh_from_db()
    assert (delivery.attempts, delivery.last_status_code) == (1, 500)
    wait = delivery.next_attempt_at - timezone.now()
    assert timedelta(seconds=3) < wait < timedelta(seconds=6)
    # Not due yet: a second message does nothing.
    assert delivery_attempt(delivery_id=delivery.pk) is None
    for _ in DELIVERY_BACKOFF_SECONDS:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(next_attempt_at=timezone.now())
        outcome = delivery_attempt(delivery_id=delivery.pk)
    assert outcome == DeliveryStatus.GAVE_UP
    delivery.refresh_from_db()
    assert delivery.attempts == len(DELIVERY_BACKOFF_SECONDS) + 1
    assert sum(DELIVERY_BACKOFF_SECONDS) / 3600 == pytest.approx(23.6, abs=1.5)  # about a day


@pytest.mark.django_db
def test_a_redirecting_callback_is_not_followed(api: APIClient, source: LocalServer,
                                                receiver: LocalServer) -> None:
    receiver.routes["/hook"] = lambda handler: reply(
        handler, 302, b"", {"Location": "https://169.254.169.254/"})
    created = ingest(api, source_url=serve(source, "/in.jsonl", ROWS),
                     callback_url=receiver.url("/hook"))
    input_copy(input_id=created["id"])
    delivery = WebhookDelivery.objects.get(input_id=created["id"])
    assert delivery_attempt(delivery_id=delivery.pk) == DeliveryStatus.PENDING
    assert [r.path for r in receiver.requests] == ["/hook"]


def test_signatures_follow_the_standard_webhooks_scheme() -> None:
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    signature = webhook_signature(secrets_=[secret], msg_id="msg_p5jXN8AQM9LWM0D4loKWxJek",
                                  when=datetime.fromtimestamp(1614265330, UTC), body=body)
    # The example from the Standard Webhooks specification.
    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.django_db
def test_the_sweeper_requeues_lost_and_stuck_ingests(api: APIClient, source: LocalServer,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "input_copy_task")
    lost = ingest(api, source_url=serve(source, "/a.jsonl", ROWS))["id"]
    stuck = ingest(api, source_url=serve(source, "/b.jsonl", ROWS))["id"]
    fresh = ingest(api, source_url=serve(source, "/c.jsonl", ROWS))["id"]
    an_hour_ago = timezone.now() - timedelta(hours=2)
    Input.objects.filter(pk__in=[lost, stuck]).update(created_at=an_hour_ago)
    Input.objects.filter(pk=stuck).update(status=InputStatus.COPYING, copy_started_at=an_hour_ago)
    assert inputs_sweep() == 2
    assert sorted(sent) == sorted([lost, stuck])
    assert Input.objects.get(pk=stuck).status == InputStatus.PENDING
    assert fresh not in sent
    assert input_copy(input_id=stuck) == InputStatus.READY


@pytest.mark.django_db(transaction=True)
def test_end_to_end_through_the_broker_and_a_worker(api_key, client_for, source: LocalServer,  # type: ignore[no-untyped-def]
                                                    receiver: LocalServer) -> None:
    """The real path: the API commits, the message goes through Redis, a Dramatiq worker
    copies the file and delivers the signed callback."""
    key, plaintext = api_key, None
    from tests.factories import api_key_make

    _key, plaintext = api_key_make(key.organization)
    broker_flush()
    created = client_for(plaintext).post(INPUTS, {
        "source_url": serve(source, "/in.jsonl", ROWS),
        "callback_url": receiver.url("/hook")}, format="json").json()
    with running_worker(threads=2):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if WebhookDelivery.objects.filter(input_id=created["id"],
                                              status=DeliveryStatus.DELIVERED).exists():
                break
            time.sleep(0.02)
    assert Input.objects.get(pk=created["id"]).status == InputStatus.READY
    (seen,) = [r for r in receiver.requests if r.path == "/hook"]
    assert json.loads(seen.body)["type"] == "input.ready"
    assert threading.active_count() >= 1
