"""Issue 40, M1: a balance is spent once, whether by realtime or by a batch job's hold.

Realtime usage reaches the ledger 30 to 60 s after it is metered (the settlement). Approval
read the ledger alone, so an organization (or a key's budget) could spend its credits in
realtime until 402 and approve a batch job on the same credits before the settlement
charged them, ending below zero. Approval now counts what realtime metered and the ledger
has not charged, and what its requests in flight reserve; and a realtime request counts a
hold approved in the last seconds, which its process's once-a-second balance read may
predate. Each attack runs through HTTP: the realtime API with a stub engine, the batch
API's approve."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

import billing.unsettled
import realtime.services.admission
from anex.errors import DomainError
from billing.models import LedgerEntry
from billing.services import credits_summary, key_spend_cents
from console.actors import Actor
from console.models import ApiKey, Organization
from inference.pricing import CENTS_PER_USD
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.lifecycle import job_approve
from realtime.models import RealtimeSettlement, RealtimeUsage
from realtime.selectors import realtime_frozen_forget
from realtime.services.admission import realtime_credits_forget
from realtime.services.settlement import realtime_charges_settle_all
from tests.factories import api_key_make, job_make, organization_make
from tests.race import run_before
from tests.servers import LocalServer, free_port, reply

pytestmark = pytest.mark.django_db
DECIDE = "/realtime/v1/systemone"
JOBS = "/batch/v1/jobs"
NOUL = {"type": "noul", "instructions": "Does the customer need an answer today?"}
# The most one decision may read (64 questions over a 50,000-character text): 0.7 of a
# credit at laya's realtime rate, counted with the test tokenizer.
MAXIMAL = {"model": "laya", "state": "We were billed twice for March. " * 1562,
           "questions": {f"q{i}": NOUL for i in range(64)}}


def decision_answer(handler: Any) -> None:
    reply(handler, body=json.dumps({
        "answers": {"q0": {"type": "noul", "noul": 0.9, "confidence": 0.9,
                           "answer_confidence": 0.9}},
        "input_tokens": 21, "routing": {"model": "english", "reason": "text is 100% Latin"},
    }).encode())


@pytest.fixture(autouse=True)
def fresh_reads() -> Iterator[None]:
    """Each test reads the switch and the balance from its own database state."""
    realtime_frozen_forget()
    realtime_credits_forget()
    yield
    realtime_frozen_forget()
    realtime_credits_forget()


@pytest.fixture
def engine(settings: Settings, server: LocalServer, tokenizer_dir: Path) -> LocalServer:
    """laya's realtime engine at the test server, and its tokenizer in the web tier (so a
    request reserves and bills its exact count)."""
    server.routes["/v1/systemone"] = decision_answer
    settings.ANEX_REALTIME_ENGINES = {"laya": server.url("")}
    settings.ANEX_CHECKPOINTS = {"laya": tokenizer_dir}
    return server


def funded(settings: Settings, cents: int) -> Organization:
    settings.ANEX_FREE_GRANT_CENTS = cents
    return organization_make()


def client(plaintext: str) -> APIClient:
    return APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}")


def spend_until_refused(api: APIClient, most: int = 40) -> int:
    """Maximal decisions, one after another, until realtime answers 402: how many were
    answered."""
    statuses = []
    for _ in range(most):
        statuses.append(api.post(DECIDE, MAXIMAL, format="json").status_code)
        if statuses[-1] != 200:
            break
    assert statuses[-1] == 402, statuses
    return statuses.count(200)


def later() -> datetime:
    return timezone.now() + timedelta(seconds=1)


def left_once_settled(organization: Organization) -> Decimal:
    """What the organization may still spend once its realtime usage is settled, in
    credits: the ledger's available balance less the fraction of a credit the settlement
    carries for each key."""
    realtime_charges_settle_all(settled_before=later())
    available = credits_summary(organization=organization).available
    carried = Decimal(0)
    for key in ApiKey.objects.filter(organization=organization):
        last = RealtimeSettlement.objects.filter(api_key=key).order_by("-id").first()
        if last is not None:
            carried += last.metered_usd * CENTS_PER_USD - last.charged_cents
    assert not RealtimeUsage.objects.filter(organization=organization, settled=False).exists()
    return available - carried


def test_realtime_usage_not_yet_settled_is_counted_by_approval(
        settings: Settings, engine: LocalServer) -> None:
    # given an organization of 3 credits that spent them in realtime until 402, none of it
    # settled into the ledger yet
    organization = funded(settings, 3)
    _, plaintext = api_key_make(organization)
    api = client(plaintext)
    assert spend_until_refused(api) == 4  # 2.8 credits
    assert credits_summary(organization=organization).balance == 3
    # when it approves, within the settlement's margin, a batch job of 1 credit
    job = job_make(organization, est_cost_cents=1)
    response = api.post(f"{JOBS}/{job.pk}/approve")
    # then the approval is the reference's 402, naming the realtime spend, and holds nothing
    assert response.status_code == 402, response.content
    detail = response.json()["detail"]
    assert detail.startswith("The balance does not cover the estimate: approving this job "
                             "holds 1 credits and 3 are available, of which realtime usage "
                             "not yet charged and realtime requests in flight hold ")
    job.refresh_from_db()
    assert job.status == JobStatus.COST_READY
    assert not LedgerEntry.objects.filter(job=job).exists()
    # and once the settlement charges the realtime usage, nothing was spent twice
    assert left_once_settled(organization) >= 0


def test_a_keys_realtime_usage_not_yet_settled_is_counted_by_its_approvals(
        settings: Settings, engine: LocalServer) -> None:
    # given a key with a budget of 3 credits, in an organization with 1,000, that spent
    # its budget in realtime until 402
    organization = funded(settings, 1000)
    key, plaintext = api_key_make(organization, spend_budget_cents=3)
    api = client(plaintext)
    assert spend_until_refused(api) == 4
    assert key_spend_cents(api_key=key) == 0  # nothing settled yet
    # when the key approves a batch job of 1 credit
    job = job_make(organization, est_cost_cents=1)
    response = api.post(f"{JOBS}/{job.pk}/approve")
    # then its budget does not cover it: 402, nothing held
    assert response.status_code == 402, response.content
    assert response.json()["detail"].startswith(
        "This API key's spend budget does not cover the estimate: approving this job holds "
        "1 credits and 3 are left of its 3-credit budget, of which its realtime usage not "
        "yet charged and its realtime requests in flight hold ")
    assert not LedgerEntry.objects.filter(job=job).exists()
    # and once settled, the key has spent no more than its budget
    realtime_charges_settle_all(settled_before=later())
    assert key_spend_cents(api_key=key) <= 3
    # while another key of the organization, which has the credits, approves it
    _, other = api_key_make(organization)
    assert client(other).post(f"{JOBS}/{job.pk}/approve").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_a_realtime_request_in_flight_is_counted_by_an_approval_made_meanwhile(
        settings: Settings, engine: LocalServer) -> None:
    # given an organization of 2 credits and an approval of a 2-credit job that has read
    # the ledger (both credits available) and not yet its realtime spend
    organization = funded(settings, 2)
    _, plaintext = api_key_make(organization)
    arrived = threading.Semaphore(0)

    def held(handler: Any) -> None:
        arrived.release()
        engine.release.wait(30)
        decision_answer(handler)

    engine.routes["/v1/systemone"] = held
    statuses: list[int] = []

    def request() -> None:
        statuses.append(client(plaintext).post(DECIDE, MAXIMAL, format="json").status_code)
        connection.close()

    def realtime_meanwhile(**_: object) -> None:
        # when a realtime request takes its reservation right then, and is in the engine
        threading.Thread(target=request, daemon=True).start()
        assert arrived.acquire(timeout=30)

    job = job_make(organization, est_cost_cents=2)
    with run_before("billing.services.hold_mark", realtime_meanwhile):
        response = client(plaintext).post(f"{JOBS}/{job.pk}/approve")
    engine.release.set()
    # then the approval counts the request's reservation: 402, nothing held
    assert response.status_code == 402, response.content
    assert "realtime requests in flight hold" in response.json()["detail"]
    assert not LedgerEntry.objects.filter(job=job).exists()


@pytest.mark.django_db(transaction=True)
def test_a_hold_approved_after_a_realtime_process_read_the_balance_is_counted(
        settings: Settings, engine: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a process that read the organization's 3 credits (a realtime request), and
    # keeps that read however slowly this test runs
    monkeypatch.setattr(realtime.services.admission, "CREDITS_READ_EVERY_SECONDS", 3600.0)
    monkeypatch.setattr(billing.unsettled, "HOLD_SEEN_SECONDS", 3600.0)
    organization = funded(settings, 3)
    _, plaintext = api_key_make(organization)
    api = client(plaintext)
    assert api.post(DECIDE, {"model": "laya", "state": "x", "questions": {"q0": NOUL}},
                    format="json").status_code == 200
    # when a 2-credit job is approved (its hold committed) and realtime then spends
    job = job_make(organization, est_cost_cents=2)
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    answered = spend_until_refused(api)
    # then realtime spent only the credit the hold left (one maximal decision, 0.7 of a
    # credit): once settled, nothing was spent twice
    assert answered == 1
    assert left_once_settled(organization) >= 0


@pytest.mark.django_db(transaction=True)
def test_a_holds_mark_is_counted_only_until_every_read_is_fresh(
        settings: Settings, engine: LocalServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a 1-credit job approved (committed) in an organization of 3 credits
    monkeypatch.setattr(billing.unsettled, "HOLD_SEEN_SECONDS", 0.0)
    organization = funded(settings, 3)
    _, plaintext = api_key_make(organization)
    api = client(plaintext)
    job = job_make(organization, est_cost_cents=1)
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 200
    # when the mark has lapsed (no process keeps a read from before the hold)
    # then realtime spends the 2 credits left, the hold counted once (by the ledger)
    realtime_credits_forget()
    assert spend_until_refused(api) == 2  # 1.4 credits; counted twice, only one would fit
    assert left_once_settled(organization) >= 0


def test_an_approval_is_503_when_the_realtime_spend_cannot_be_read(
        settings: Settings) -> None:
    organization = funded(settings, 100)
    key, _ = api_key_make(organization)
    job = job_make(organization, est_cost_cents=10)
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    with pytest.raises(DomainError) as error:
        job_approve(job=job, actor=Actor(key=key))
    assert error.value.status == 503
    assert "so the approval was not made and nothing was held" in error.value.detail
    job.refresh_from_db()
    assert job.status == JobStatus.COST_READY
    assert not LedgerEntry.objects.filter(job=job).exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("holder", ["organization", "key"])
def test_realtime_and_approvals_at_once_never_spend_a_credit_twice(
        settings: Settings, engine: LocalServer, holder: str,
        connections_many: None) -> None:
    """Race: 16 maximal decisions and four 1-credit approvals at once, on 3 credits (the
    organization's, or a key's budget)."""
    from concurrent.futures import ThreadPoolExecutor

    settings.ANEX_REALTIME_PROCESS_CONCURRENCY = 32
    organization = funded(settings, 3 if holder == "organization" else 1000)
    key, plaintext = api_key_make(organization, **(
        {"spend_budget_cents": 3} if holder == "key" else {}))
    jobs = [job_make(organization, est_cost_cents=1) for _ in range(4)]
    start = threading.Barrier(20)

    def call(work: Callable[[APIClient], Any]) -> int:
        api = client(plaintext)
        start.wait(30)
        try:
            return int(work(api).status_code)
        finally:
            connection.close()

    def decide(api: APIClient) -> Any:
        return api.post(DECIDE, MAXIMAL, format="json")

    def approve(job: Job) -> Callable[[APIClient], Any]:
        return lambda api: api.post(f"{JOBS}/{job.pk}/approve")

    with ThreadPoolExecutor(20) as pool:
        futures = [pool.submit(call, decide) for _ in range(16)]
        futures += [pool.submit(call, approve(job)) for job in jobs]
        statuses = [future.result(120) for future in futures]
    assert set(statuses) <= {200, 402, 429}, statuses
    assert RealtimeUsage.objects.exists()
    if holder == "organization":
        assert left_once_settled(organization) >= 0
    else:
        left_once_settled(organization)
        settlement = RealtimeSettlement.objects.filter(api_key=key).order_by("-id").first()
        carried = (settlement.metered_usd * CENTS_PER_USD - settlement.charged_cents
                   if settlement is not None else 0)
        assert key_spend_cents(api_key=key) + carried <= 3
    assert Job.objects.filter(pk__in=[j.pk for j in jobs],
                              status=JobStatus.IN_PROGRESS).count() == statuses[16:].count(200)
