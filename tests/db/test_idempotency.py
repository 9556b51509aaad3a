"""Idempotency-Key on POST /inputs, POST /jobs, approve and cancel (Stripe's semantics):
a replay answers the first response and does nothing again, another request under the key
is 422, keys are per organization and last 24 hours, concurrent duplicates do the work
once."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from anex.crypto import secret_decrypt, secret_encrypt
from anex.periodic import SCHEDULE
from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_grant, credits_summary
from console.models import Organization
from jobs import idempotency
from jobs.constants import JobStatus
from jobs.idempotency import (
    BAD_KEY_DETAIL,
    IN_FLIGHT_DETAIL,
    MISMATCH_DETAIL,
    fingerprint_of,
    idempotency_records_purge,
)
from jobs.models import IdempotencyRecord, Input, Job
from tests.db.test_races import THREADS, race
from tests.factories import SYSTEM, api_key_make, input_ready, job_make, organization_make

JOBS = "/batch/v1/jobs"
INPUTS = "/batch/v1/inputs"
ROW = b'{"custom_id":"r1","method":"POST","url":"/v1/chat/completions","body":{}}\n'


@pytest.fixture(autouse=True)
def funded(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 1000


def keyed(api: APIClient, path: str, body: dict[str, Any] | None, key: str) -> Any:
    return api.post(path, body, format="json", HTTP_IDEMPOTENCY_KEY=key)


def submit_body(item: Input) -> dict[str, Any]:
    return {"input_id": str(item.pk), "model": "laya"}


# --- replay -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_replayed_submit_answers_the_first_response_and_creates_nothing(
        api: APIClient, organization: Organization) -> None:
    # given a submit made with a key
    item = input_ready(organization, ROW)
    first = keyed(api, JOBS, submit_body(item), "submit-1")
    assert first.status_code == 200 and "Idempotent-Replayed" not in first
    # when the same request is sent again, its keys in another order
    again = keyed(api, JOBS, {"model": "laya", "input_id": str(item.pk)}, "submit-1")
    # then it answers the first response, marked as a replay, and no second job exists
    assert (again.status_code, again.json()) == (200, first.json())
    assert again["Idempotent-Replayed"] == "true"
    assert Job.objects.for_org(organization).count() == 1


@pytest.mark.django_db
def test_without_the_header_every_submit_creates_a_job(api: APIClient,
                                                       organization: Organization) -> None:
    # The reference: "every POST /jobs that succeeds creates a new job".
    item = input_ready(organization, ROW)
    ids = {api.post(JOBS, submit_body(item), format="json").json()["id"] for _ in range(2)}
    assert len(ids) == 2
    assert not IdempotencyRecord.objects.exists()


@pytest.mark.django_db
def test_a_replayed_upload_target_is_the_same_input(api: APIClient,
                                                    organization: Organization) -> None:
    first = keyed(api, INPUTS, {"format": "jsonl"}, "upload-1")
    again = keyed(api, INPUTS, {"format": "jsonl"}, "upload-1")
    assert first.status_code == again.status_code == 200
    assert again.json() == first.json()
    assert Input.objects.for_org(organization).count() == 1


@pytest.mark.django_db
def test_the_kept_response_is_encrypted(api: APIClient) -> None:
    # An upload target's answer carries its signed form (an ingest's, its callback secret).
    first = keyed(api, INPUTS, {"format": "jsonl"}, "upload-2").json()
    stored = IdempotencyRecord.objects.get().body_encrypted
    assert first["id"] not in stored and json.dumps(first["fields"])[2:20] not in stored
    assert json.loads(secret_decrypt(stored)) == first


@pytest.mark.django_db
def test_a_replayed_approval_answers_in_progress_and_holds_once(
        api: APIClient, organization: Organization) -> None:
    job = job_make(organization, est_cost_cents=300)
    first = keyed(api, f"{JOBS}/{job.pk}/approve", None, "approve-1")
    assert first.json() == {"id": str(job.pk), "status": "in_progress"}
    # A plain second approval is the reference's 409; the keyed one is the first answer.
    assert api.post(f"{JOBS}/{job.pk}/approve").status_code == 409
    again = keyed(api, f"{JOBS}/{job.pk}/approve", None, "approve-1")
    assert (again.status_code, again.json()) == (200, first.json())
    assert LedgerEntry.objects.filter(job=job, kind=EntryKind.HOLD).count() == 1
    assert credits_summary(organization=organization).held == 300


@pytest.mark.django_db
def test_a_replayed_cancel_answers_the_first_response(api: APIClient,
                                                      organization: Organization) -> None:
    job = job_make(organization)
    first = keyed(api, f"{JOBS}/{job.pk}/cancel", None, "cancel-1")
    assert first.json() == {"id": str(job.pk), "status": "cancelled"}
    again = keyed(api, f"{JOBS}/{job.pk}/cancel", None, "cancel-1")
    assert (again.status_code, again.json()) == (200, first.json())
    # Without the key, the reference's answer for a cancelled job is unchanged.
    assert api.post(f"{JOBS}/{job.pk}/cancel").status_code == 409


# --- another request under the key ---------------------------------------------------


@pytest.mark.django_db
def test_the_same_key_with_another_body_is_422(api: APIClient,
                                               organization: Organization) -> None:
    item = input_ready(organization, ROW)
    keyed(api, JOBS, submit_body(item), "submit-2")
    other = keyed(api, JOBS, {**submit_body(item), "max_output_tokens": 50}, "submit-2")
    assert (other.status_code, other.json()) == (422, {"detail": MISMATCH_DETAIL})
    assert Job.objects.for_org(organization).count() == 1


@pytest.mark.django_db
def test_the_same_key_on_another_endpoint_or_job_is_422(api: APIClient,
                                                        organization: Organization) -> None:
    one, two = job_make(organization), job_make(organization)
    assert keyed(api, f"{JOBS}/{one.pk}/approve", None, "k").status_code == 200
    for path in (f"{JOBS}/{two.pk}/approve", f"{JOBS}/{one.pk}/cancel"):
        response = keyed(api, path, None, "k")
        assert (response.status_code, response.json()) == (422, {"detail": MISMATCH_DETAIL})
    two.refresh_from_db()
    assert two.status == JobStatus.COST_READY


@pytest.mark.django_db
def test_keys_are_per_organization(api: APIClient, organization: Organization,
                                   client_for: Callable[[str], APIClient]) -> None:
    # given a key used by one organization
    keyed(api, JOBS, submit_body(input_ready(organization, ROW)), "shared")
    # when another organization sends the same key
    other = organization_make()
    theirs = client_for(api_key_make(other)[1])
    response = keyed(theirs, JOBS, submit_body(input_ready(other, ROW)), "shared")
    # then it is a request of its own: its own job, never the first organization's answer
    assert response.status_code == 200 and "Idempotent-Replayed" not in response
    assert Job.objects.for_org(other).get().pk.hex == response.json()["id"].replace("-", "")


@pytest.mark.django_db
def test_another_organizations_job_is_404_and_spends_no_key(api: APIClient) -> None:
    theirs = job_make(organization_make())
    response = keyed(api, f"{JOBS}/{theirs.pk}/approve", None, "probe")
    assert (response.status_code, response.json()) == (404, {"detail": "Job not found"})
    assert not IdempotencyRecord.objects.exists()


# --- errors, expiry, bad keys ------------------------------------------------------------


@pytest.mark.django_db
def test_an_error_is_not_kept_so_the_key_can_be_retried(api: APIClient,
                                                        organization: Organization) -> None:
    # given an approval refused for want of credits
    job = job_make(organization, est_cost_cents=5000)
    refused = keyed(api, f"{JOBS}/{job.pk}/approve", None, "approve-2")
    assert refused.status_code == 402
    assert not IdempotencyRecord.objects.exists()
    # when the organization tops up and the same request is retried with the same key
    credits_grant(organization=organization, cents=5000, reason="top-up", actor=SYSTEM)
    retried = keyed(api, f"{JOBS}/{job.pk}/approve", None, "approve-2")
    # then it runs, and it is its answer that is kept from now on
    assert (retried.status_code, retried.json()["status"]) == (200, "in_progress")
    assert keyed(api, f"{JOBS}/{job.pk}/approve", None, "approve-2").json() == retried.json()


@pytest.mark.django_db
def test_a_key_older_than_24_hours_is_a_new_request(api: APIClient,
                                                    organization: Organization) -> None:
    item = input_ready(organization, ROW)
    first = keyed(api, JOBS, submit_body(item), "daily")
    IdempotencyRecord.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    again = keyed(api, JOBS, submit_body(item), "daily")
    assert again.status_code == 200 and again.json()["id"] != first.json()["id"]
    # and the new request owns the key for the next 24 hours
    record = IdempotencyRecord.objects.get()
    assert json.loads(secret_decrypt(record.body_encrypted)) == again.json()
    assert record.expires_at > timezone.now() + timedelta(hours=23)


@pytest.mark.django_db
def test_the_clock_purges_expired_records_only(organization: Organization) -> None:
    now = timezone.now()
    for key, expires in (("old", now - timedelta(minutes=1)), ("new", now + timedelta(hours=1))):
        IdempotencyRecord.objects.create(organization=organization, key=key, fingerprint="f",
                                         status_code=200, expires_at=expires)
    assert idempotency_records_purge() == 1
    assert list(IdempotencyRecord.objects.values_list("key", flat=True)) == ["new"]
    assert "jobs.tasks.idempotency_records_purge_task" in {task.actor for task in SCHEDULE}


@pytest.mark.django_db
@pytest.mark.parametrize("key", ["", "x" * 256, "new\nline", "caf\u00e9"])
def test_a_malformed_key_is_422(api: APIClient, key: str) -> None:
    response = keyed(api, INPUTS, {"format": "jsonl"}, key)
    assert (response.status_code, response.json()) == (422, {"detail": BAD_KEY_DETAIL})
    assert not Input.objects.exists()


# --- concurrency -------------------------------------------------------------------------


def _client(plaintext: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    return client


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_submits_with_one_key_create_one_job() -> None:
    # given an organization, a ready input and a key
    organization = organization_make()
    credits_grant(organization=organization, cents=1000, reason="race", actor=SYSTEM)
    _, plaintext = api_key_make(organization)
    item = input_ready(organization, ROW)

    # when twenty clients send the same keyed submit at once
    def send() -> tuple[int, Any]:
        response = keyed(_client(plaintext), JOBS, submit_body(item), "race-submit")
        return response.status_code, response.json()

    results = race(send)

    # then one job exists, and every client got its id: the first did the work, the rest
    # waited for it and replayed its answer
    jobs = list(Job.objects.for_org(organization))
    assert len(jobs) == 1, results
    assert results == [(200, {"id": str(jobs[0].pk), "status": "submitted"})] * THREADS


@pytest.mark.django_db(transaction=True)
def test_twenty_concurrent_keyed_approvals_hold_once_and_all_answer_it(
        settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    credits_grant(organization=organization, cents=1000, reason="race", actor=SYSTEM)
    _, plaintext = api_key_make(organization)
    job = job_make(organization, est_cost_cents=700)

    results = race(lambda: keyed(_client(plaintext), f"{JOBS}/{job.pk}/approve", None,
                                 "race-approve").json())

    assert results == [{"id": str(job.pk), "status": "in_progress"}] * THREADS
    assert LedgerEntry.objects.filter(job=job, kind=EntryKind.HOLD).count() == 1
    assert credits_summary(organization=organization).held == 700


@pytest.mark.django_db(transaction=True)
def test_a_duplicate_waits_for_the_first_then_409_past_the_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given a first request that holds its key in a transaction that has not ended
    monkeypatch.setattr(idempotency, "WAIT_SECONDS", 0.3)  # held past it, whatever it is
    organization = organization_make()
    api_key, plaintext = api_key_make(organization)
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        try:
            with transaction.atomic():
                IdempotencyRecord.objects.create(
                    organization=organization, key="slow",
                    fingerprint=fingerprint_of("POST", INPUTS, {"format": "jsonl"},
                                               api_key=api_key, region="world"),
                    status_code=200,
                    body_encrypted=secret_encrypt('{"id": "the first answer"}'),
                    expires_at=timezone.now() + timedelta(hours=24))
                holding.set()
                release.wait(30)
        finally:
            connection.close()

    thread = threading.Thread(target=first)
    thread.start()
    assert holding.wait(30)
    try:
        # when a duplicate arrives and the first is still running past the wait
        early = keyed(_client(plaintext), INPUTS, {"format": "jsonl"}, "slow")
    finally:
        release.set()
        thread.join(30)
    # then it is told to retry, and nothing was done for it
    assert (early.status_code, early.json()) == (409, {"detail": IN_FLIGHT_DETAIL})
    assert early["Retry-After"] == "1"
    assert not Input.objects.exists()
    # and once the first has finished, the retry replays the first's answer
    late = keyed(_client(plaintext), INPUTS, {"format": "jsonl"}, "slow")
    assert (late.status_code, late.json()) == (200, {"id": "the first answer"})



# --- issue 22, L1: a key is bound to the API key that used it and the host's region -----


@pytest.mark.django_db
def test_another_api_key_cannot_replay_an_answer_past_its_own_scopes(
        organization: Organization) -> None:
    # given a job approved by an unscoped key under an Idempotency-Key
    job = job_make(organization, model="laya")
    _, first = api_key_make(organization)
    approved = keyed(_client(first), f"{JOBS}/{job.pk}/approve", None, "approve-once")
    assert approved.status_code == 200
    # when a key of the same organization scoped to another model sends the same request
    # under the same key
    _, narrow = api_key_make(organization, model_scopes=["qwen3.8-27b"])
    replayed = keyed(_client(narrow), f"{JOBS}/{job.pk}/approve", None, "approve-once")
    # then it is not handed the first key's answer: the key is another request's
    assert (replayed.status_code, replayed.json()) == (422, {"detail": MISMATCH_DETAIL})
    assert "Idempotent-Replayed" not in replayed
    # and without the header its own scopes answer, as they always did
    own = _client(narrow).post(f"{JOBS}/{job.pk}/approve")
    assert own.status_code == 403, own.json()
    # while the first key still replays its own answer
    again = keyed(_client(first), f"{JOBS}/{job.pk}/approve", None, "approve-once")
    assert (again.status_code, again.json(), again["Idempotent-Replayed"]) == (
        200, approved.json(), "true")


@pytest.mark.django_db
def test_the_other_regions_host_cannot_replay_an_answer(organization: Organization) -> None:
    # given an input created on the world host under an Idempotency-Key
    _, plaintext = api_key_make(organization)
    client = _client(plaintext)
    created = keyed(client, INPUTS, {"format": "jsonl"}, "input-once")
    assert created.status_code == 200
    # when the same key, request and API key reach the EU host
    eu = client.post(INPUTS, {"format": "jsonl"}, format="json",
                     HTTP_IDEMPOTENCY_KEY="input-once", HTTP_HOST="api-eu.anex.sh")
    # then the world host's answer (its upload target, its region) is not replayed there
    assert (eu.status_code, eu.json()) == (422, {"detail": MISMATCH_DETAIL})
    assert Input.objects.for_org(organization).count() == 1
