"""Services refuse with status-less domain errors (anex/errors.py), answered through one
table: every refusal has an answer, the API's handler and the console's JSON endpoint give
the same status, headers and body for it, and a service's refusal reads the same through
the batch API, the realtime API and the console. No service names an HTTP error."""

from __future__ import annotations

import json
from typing import Any

import pytest
from allauth.account.models import EmailAddress
from django.test import Client
from pytest_django import Settings
from rest_framework.test import APIClient

import inference.kinds
from anex.api.errors import error_json_response, exception_handler
from anex.errors import (
    ANSWERED_WITH,
    Conflict,
    DomainError,
    EngineFailed,
    Forbidden,
    Gone,
    Invalid,
    Malformed,
    NotFound,
    NotServed,
    PaymentRequired,
    QuotaExceeded,
    RateLimited,
    TimedOut,
    TooLarge,
    Unavailable,
    WrongRegion,
    answered_with,
)
from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import NO_CREDITS_DETAIL, credits_summary
from console.models import Organization
from jobs.constants import JobStatus
from tests.db.test_console import form
from tests.factories import api_key_make, job_make, organization_make, user_make
from tests.product import product_sources, relative


def _subclasses(cls: type[DomainError]) -> set[type[DomainError]]:
    found = set()
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_domain_error_has_an_answer_in_the_one_table() -> None:
    assert issubclass(inference.kinds.RequestRefused, DomainError)  # the kinds' too
    classes = _subclasses(DomainError)
    assert set(ANSWERED_WITH) <= classes
    assert {type(error) for error, _ in EXAMPLES} == classes  # each is tried below
    for cls in classes:
        assert 400 <= answered_with(cls) < 600, cls
    assert answered_with(inference.kinds.RequestRefused) == 400
    assert answered_with(inference.kinds.RequestMalformed) == 422
    with pytest.raises(LookupError):
        answered_with(DomainError)


# Each refusal and the status the reference's error table gives it.
EXAMPLES: list[tuple[DomainError, int]] = [
    (Invalid("format must be jsonl or parquet."), 400),
    (PaymentRequired(NO_CREDITS_DETAIL), 402),
    (Forbidden("no"), 403),
    (NotFound.of("Job"), 404),
    (TimedOut("The request body did not arrive in time."), 408),  # issue 40 M2
    (Conflict("This job is done: it is too late to cancel it."), 409),
    (Gone("gone"), 410),
    (TooLarge("too large"), 413),
    (WrongRegion("this job is stored in the EU region; use https://api-eu.anex.sh",
                 residency="eu", api="https://api-eu.anex.sh"), 421),
    (Malformed("Unknown model 'x': pass a model id from the models table, verbatim."), 422),
    (RateLimited("slow down", retry_after=7, code="rate_limit_exceeded"), 429),
    (RateLimited("queue full", retry_after=60), 429),
    (QuotaExceeded("Storage quota reached", retry_after=3600), 429),
    (NotServed("not served"), 501),
    (EngineFailed("failed"), 502),
    (Unavailable("later"), 503),
    (inference.kinds.RequestRefused("over a limit"), 400),
    (inference.kinds.RequestMalformed("wrong shape"), 422),
]


@pytest.mark.parametrize(("error", "status"), EXAMPLES,
                         ids=[type(error).__name__ for error, _ in EXAMPLES])
def test_the_api_and_the_consoles_json_answer_a_refusal_alike(error: DomainError, status: int,
                                                              settings: Settings) -> None:
    api = exception_handler(error, {})
    console = error_json_response(error)
    assert api.status_code == console.status_code == error.status == status
    assert api.data == json.loads(console.content) == {"detail": error.detail, **error.extra}
    assert api.get("Retry-After") == console.get("Retry-After")
    if status in (429, 503):
        assert api["Retry-After"] == str(error.retry_after or settings.ANEX_RETRY_AFTER_SECONDS)
    else:
        assert not api.has_header("Retry-After")


def test_the_reference_bodies_carry_their_extra_fields() -> None:
    assert WrongRegion("x", residency="eu", api="https://api-eu.anex.sh").body() == {
        "detail": "x", "residency": "eu", "api": "https://api-eu.anex.sh"}
    assert RateLimited("x", retry_after=1, code="rate_limit_exceeded").body() == {
        "detail": "x", "error": {"code": "rate_limit_exceeded", "message": "x"}}
    assert RateLimited("x", retry_after=1).body() == {"detail": "x"}


# -- one refusal, every front door ---------------------------------------------------------

def _signed_in(organization: Organization) -> Client:
    user = user_make(organization)
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    client = Client()
    client.force_login(user)
    return client


def _broke() -> Organization:
    organization = organization_make()
    LedgerEntry.objects.create(organization=organization, kind=EntryKind.ADJUSTMENT,
                               balance_delta=-credits_summary(organization=organization).balance,
                               idempotency_key=f"test:{organization.pk}")
    return organization


@pytest.mark.django_db
def test_no_credits_reads_the_same_through_the_api_and_the_console(
        client_for: Any) -> None:
    organization = _broke()
    api = client_for(api_key_make(organization)[1])
    console = _signed_in(organization)
    answers = [api.post("/batch/v1/inputs", {"format": "jsonl"}, format="json"),
               console.post("/console/jobs/upload", form(organization, {"format": "jsonl"}))]
    assert [(a.status_code, json.loads(a.content)) for a in answers] == [
        (402, {"detail": NO_CREDITS_DETAIL})] * 2


@pytest.mark.django_db
def test_a_bad_format_reads_the_same_through_the_api_and_the_console(
        api: APIClient, organization: Organization) -> None:
    answers: list[Any] = [
        api.post("/batch/v1/inputs", {"format": "csv"}, format="json"),
        _signed_in(organization).post("/console/jobs/upload",
                                      form(organization, {"format": "csv"}))]
    assert [(a.status_code, json.loads(a.content)) for a in answers] == [
        (400, {"detail": "format must be jsonl or parquet."})] * 2


@pytest.mark.django_db
def test_eu_routing_off_reads_the_same_through_the_batch_and_the_realtime_api(
        api: APIClient, settings: Settings) -> None:
    # The region is judged before the engine is asked anything: nothing listens there.
    settings.ANEX_REALTIME_ENGINES = {"all-minilm-l6-v2": "http://127.0.0.1:9"}
    batch = api.post("/batch/v1/inputs", {"format": "jsonl", "data_residency": "eu"},
                     format="json")
    realtime = api.post("/realtime/v1/embeddings", {"model": "all-minilm-l6-v2",
                                                    "input": "x"},
                        format="json", HTTP_HOST="api-eu.anex.sh")
    assert (batch.status_code, batch.json()) == (realtime.status_code, realtime.json()) == (
        403, {"detail": "EU data routing is not enabled for this organization. Contact us "
                        "to enable it."})


@pytest.mark.django_db
def test_a_wrong_state_reads_the_same_through_the_api_and_the_console(
        api: APIClient, organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.DONE)
    detail = "This job is done: only a job in cost_ready can be approved."
    answer = api.post(f"/batch/v1/jobs/{job.pk}/approve")
    assert (answer.status_code, answer.json()) == (409, {"detail": detail})
    page = _signed_in(organization).post(f"/console/jobs/{job.pk}/approve", form(organization),
                                         follow=True)
    assert detail in page.content.decode()


@pytest.mark.django_db
def test_another_organizations_job_is_404_through_the_api_and_the_console(
        api: APIClient) -> None:
    other = job_make(organization_make())
    answer = api.get(f"/batch/v1/jobs/{other.pk}")
    assert (answer.status_code, answer.json()) == (404, {"detail": "Job not found"})
    assert _signed_in(organization_make()).get(f"/console/jobs/{other.pk}").status_code == 404


# -- no service names an HTTP error --------------------------------------------------------

# The entry points, which may raise or build the API's own answer (ApiError) or DRF's: the
# API views and the API's plumbing (anex/api: the handler, authentication, throttling; the
# Idempotency-Key decorator).
VIEWS = {"jobs/api.py", "jobs/idempotency.py", "openai_api/api.py", "realtime/api.py"}


def test_no_service_or_worker_raises_or_catches_an_http_error() -> None:
    offenders = []
    for path in product_sources():
        name = relative(path)
        if name in VIEWS or name.startswith("anex/api/"):
            continue
        text = path.read_text()
        if "ApiError" in text or "rest_framework.exceptions" in text:
            offenders.append(name)
    assert offenders == []
