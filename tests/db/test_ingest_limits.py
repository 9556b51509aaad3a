"""Issue 11, item 3: a customer URL cannot hold our web server or ingest workers.

A source that trickles its headers one byte a second used to hold the size probe inside
POST /inputs for days, and one that trickled its body held an ingest thread; socket
timeouts are per read, so neither ever tripped them. Here the attacks run against local
tarpits while another customer's work is answered, and each ends at its deadline.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests
from django.db import connection
from pytest_django import Settings
from rest_framework.test import APIClient

from jobs.constants import InputStatus
from jobs.models import Input
from jobs.services import inputs as inputs_service
from jobs.services.inputs import input_copy
from jobs.services.recovery import inputs_sweep
from jobs.storage import storage_for
from tests.dispatched import dispatch_catch
from tests.factories import api_key_make, organization_make
from tests.race import run_after
from tests.servers import LocalServer, reply, tls_context, trickle
from tests.workers import broker_flush, running_worker

INPUTS = "/batch/v1/inputs"
ROWS = b'{"custom_id":"row-1","method":"POST","url":"/v1/chat/completions","body":{}}\n' * 50
HEADER_TARPIT = b"HTTP/1.1 200 OK\r\nX-Slow: "
BODY_TARPIT = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n{"


@pytest.fixture
def source(make_server: Callable[..., LocalServer], ca: Any, trust_ca: None,
           loopback: None) -> LocalServer:
    """The customer's https host, on loopback, with a certificate our test CA signed."""
    source = make_server(tls=tls_context(ca, "127.0.0.1"))
    source.routes["/in.jsonl"] = lambda handler: reply(handler, 200, ROWS)
    return source


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    sent: list[str] = []
    dispatch_catch(monkeypatch, lambda message: sent.append(message.id), "input_copy_task")
    return sent


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


# --- the probe inside POST /inputs --------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_source_trickling_its_headers_does_not_hold_the_web_server(
        live_server: Any, source: LocalServer, settings: Settings,
        no_broker: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # given eight requests (make run's 2 workers x 4 threads) whose source trickles its
    # headers one byte a second, and another customer with ordinary work; the probe gives
    # up at 2 s (3 s in the product): the other customer is still answered within it
    monkeypatch.setattr(inputs_service, "PROBE_DEADLINE_SECONDS", 2.0)
    settings.ANEX_API_ORIGIN = live_server.url
    source.routes["/tarpit.jsonl"] = trickle(HEADER_TARPIT, every=1.0)
    _attacker_key, attacker = api_key_make(organization_make())
    _other_key, other = api_key_make(organization_make())

    def post(token: str, url: str) -> tuple[int, float]:
        started = time.monotonic()
        response = requests.post(f"{live_server.url}{INPUTS}", json={"source_url": url},
                                 headers={"Authorization": f"Bearer {token}"}, timeout=30)
        return response.status_code, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=8) as pool:
        attacks = [pool.submit(post, attacker, source.url("/tarpit.jsonl")) for _ in range(8)]
        _wait_for(lambda: sum(seen.path == "/tarpit.jsonl" for seen in source.requests) == 8,
                  10)
        # when another customer asks meanwhile, with every attack at the tarpit
        answered = post(other, source.url("/in.jsonl"))
        attacks_running = sum(not attack.done() for attack in attacks)
        results = [attack.result() for attack in attacks]

    # then that customer is answered at once, while the attack runs
    assert answered[0] == 200 and answered[1] < 2.5
    assert attacks_running == 8
    # and every attacked request ends at the probe's deadline: accepted, since the source
    # did not say its size in time (the reference: the copy refuses it instead)
    deadline = inputs_service.PROBE_DEADLINE_SECONDS
    assert [status for status, _ in results] == [200] * 8
    assert all(deadline - 0.2 < elapsed < deadline + 3 for _, elapsed in results)
    assert Input.objects.filter(status=InputStatus.PENDING).count() == 9


@pytest.mark.django_db
def test_an_unresolvable_source_and_an_internal_one_get_the_same_400(
        api: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # given our resolver knows an internal name and not another
    def resolver(host: str, port: int, *args: Any, **kwargs: Any) -> list[Any]:
        if host == "db.internal.test":
            return [(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "",
                     ("10.0.0.7", port))]
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", resolver)

    # when an attacker probes both through source_url
    internal = api.post(INPUTS, {"source_url": "https://db.internal.test/x"}, format="json")
    unknown = api.post(INPUTS, {"source_url": "https://db.nowhere.test/x"}, format="json")

    # then nothing tells them apart but the name they sent
    assert (internal.status_code, unknown.status_code) == (400, 400)
    assert unknown.json() == {"detail": "source_url cannot be fetched: db.nowhere.test is "
                                        "not a public internet address"}
    assert internal.json()["detail"] == unknown.json()["detail"].replace("nowhere",
                                                                         "internal")
    assert not Input.objects.exists()


# --- the copy -----------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_source_trickling_its_body_fails_its_copy_at_the_deadline_in_one_attempt(
        source: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # given an ingest whose source sends '{' and then one byte at a time, forever, and
    # another customer's ordinary ingest, both through the broker to a two-thread worker
    monkeypatch.setattr(inputs_service, "COPY_DEADLINE_SECONDS", 2.4)
    source.routes["/tarpit.jsonl"] = trickle(BODY_TARPIT, every=0.2)
    _attacker_key, attacker = api_key_make(organization_make())
    _other_key, other = api_key_make(organization_make())
    broker_flush()

    def ingest(token: str, path: str) -> str:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
        response = client.post(INPUTS, {"source_url": source.url(path)}, format="json")
        assert response.status_code == 200, response.content
        return str(response.json()["id"])

    attack = ingest(attacker, "/tarpit.jsonl")

    def status(input_id: str) -> str:
        return str(Input.objects.get(pk=input_id).status)

    with running_worker(threads=2):
        assert _wait_for(lambda: status(attack) == InputStatus.COPYING, 10)
        started = time.monotonic()
        # when another customer's ingest arrives while the attack is copying
        ordinary = ingest(other, "/in.jsonl")

        # then it is copied while the attack still holds its thread
        assert _wait_for(lambda: status(ordinary) == InputStatus.READY, 10)
        assert status(attack) == InputStatus.COPYING
        # and the attack ends at its deadline: failed, one attempt, nothing kept
        assert _wait_for(lambda: status(attack) == InputStatus.FAILED, 10)
        assert time.monotonic() - started < 2.4 + 3
    item = Input.objects.get(pk=attack)
    assert item.error == "The source was too slow: the copy did not finish within 0.04 minutes."
    assert item.attempts == 1
    assert item.source_url == ""
    assert not storage_for(item.data_residency).exists(item.object_key)
    # terminal: the recovery pass has nothing to hand out again
    assert inputs_sweep() == 0
    assert Input.objects.get(pk=attack).status == InputStatus.FAILED
    connection.close()


@pytest.mark.django_db
def test_the_copy_deadline_fits_inside_the_copy_lease() -> None:
    # A copy cut by its deadline settles before the recovery pass would take its worker
    # for dead and start a second one on the same source.
    assert (inputs_service.COPY_DEADLINE_SECONDS
            < inputs_service.COPY_TIME_LIMIT.total_seconds())


# --- concurrent ingests per organization --------------------------------------------------


@pytest.mark.django_db
def test_an_organization_past_its_concurrent_ingests_gets_429(
        api: APIClient, source: LocalServer, client_for: Callable[[str], APIClient],
        monkeypatch: pytest.MonkeyPatch, no_broker: list[str]) -> None:
    monkeypatch.setattr(inputs_service, "INGEST_CONCURRENCY_LIMIT", 2)
    url = source.url("/in.jsonl")
    first = api.post(INPUTS, {"source_url": url}, format="json").json()["id"]
    assert api.post(INPUTS, {"source_url": url}, format="json").status_code == 200
    probes = len(source.requests)

    # when a third arrives while two are pending
    refused = api.post(INPUTS, {"source_url": url}, format="json")

    # then it is 429 with Retry-After, before the source is contacted
    assert refused.status_code == 429
    assert refused.json() == {"detail": "Too many ingests in progress: this organization "
                                        "already has 2 pending or copying (the limit is 2). "
                                        "Wait for some to become ready or fail, then retry."}
    assert int(refused["Retry-After"]) == inputs_service.INGEST_RETRY_AFTER
    assert len(source.requests) == probes
    assert Input.objects.count() == 2
    # another organization is not affected
    _key, plaintext = api_key_make(organization_make())
    assert client_for(plaintext).post(INPUTS, {"source_url": url},
                                      format="json").status_code == 200
    # and once one copy settles, the organization may ingest again
    assert input_copy(input_id=first) == InputStatus.READY
    assert api.post(INPUTS, {"source_url": url}, format="json").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_concurrent_ingests_cannot_overshoot_the_limit(
        source: LocalServer, monkeypatch: pytest.MonkeyPatch, no_broker: list[str]) -> None:
    # given one slot left, and every request held right after its probe until all four
    # have probed, so that each passed the early check before any takes the lock
    monkeypatch.setattr(inputs_service, "INGEST_CONCURRENCY_LIMIT", 2)
    probed = threading.Barrier(4)
    _key, plaintext = api_key_make(organization_make())
    barrier = threading.Barrier(4)

    def post() -> int:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        try:
            barrier.wait(30)  # one that never arrives fails the test, not hangs it
            return int(client.post(INPUTS, {"source_url": source.url("/in.jsonl")},
                                   format="json").status_code)
        finally:
            connection.close()

    with run_after("jobs.services.inputs._advertised_size",
                   lambda *args, **kwargs: probed.wait(30), every=True), \
            ThreadPoolExecutor(max_workers=4) as pool:
        codes = sorted(pool.map(lambda _: post(), range(4)))

    assert codes == [200, 200, 429, 429]
    assert Input.objects.count() == 2
