"""Preflight checks (POST /checks, GET /checks/{id}): the estimate's own row checks, run in
collect mode, report every failing row (up to 1,000) with the reason a job would fail
with; free, no job, no approval slot; the submit's 402/403/421 rules; rate-limited per
organization; idempotent with a key."""

from __future__ import annotations

import io
import json
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.models import LedgerEntry
from billing.services import credits_summary
from console.models import Organization
from inference.catalog import model_get
from inference.rows.core import JobOptions, RowRejected
from jobs.constants import CheckStatus, JobStatus
from jobs.models import Job, PreflightCheck
from jobs.services.checks import (
    CHECK_FAILED_INTERNALLY,
    CHECK_STALE,
    check_run,
    checks_settle_stale,
)
from jobs.services.estimation import job_estimate
from jobs.services.submission import APPROVAL_QUEUE_LIMIT
from jobs.validation import RowErrors, validate_jsonl
from tests.factories import api_key_make, input_ready, job_make, organization_make
from tests.workers import broker_flush, running_worker

CHECKS = "/batch/v1/checks"
JOBS = "/batch/v1/jobs"
EU_HOST = "api-eu.anex.sh"


@pytest.fixture(autouse=True)
def served(checkpoints: Path) -> None:
    """Every catalog model has its checkpoint (tokenizer) configured."""


def chat_row(custom_id: str, content: Any = "Say hello in French.", **body: Any) -> bytes:
    return json.dumps({"custom_id": custom_id, "method": "POST",
                       "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": content}], **body}}
                      ).encode() + b"\n"


def with_bad_lines(total: int, bad: dict[int, bytes]) -> bytes:
    """`total` good chat lines, with line n (from 1) replaced by bad[n]."""
    return b"".join(bad.get(n, chat_row(f"row-{n}")) for n in range(1, total + 1))


BAD = {
    # a content part no model knows
    2: chat_row("row-2", [{"type": "hologram", "hologram": {}}]),
    # not JSON at all: no custom_id to report
    50: b'{"custom_id": "row-50", "method": "POST", \n',
    # the custom_id of an earlier line
    900: chat_row("row-1"),
}


def check_start(api: APIClient, item_id: str, **fields: Any) -> dict[str, Any]:
    response = api.post(CHECKS, {"input_id": item_id, "model": "gemma4-12b", **fields},
                        format="json")
    assert response.status_code == 202, response.content
    return response.json()  # type: ignore[no-any-return]


def checked(api: APIClient, check_id: str) -> dict[str, Any]:
    check_run(check_id=check_id)  # what the check_run_task actor does
    response = api.get(f"{CHECKS}/{check_id}")
    assert response.status_code == 200, response.content
    return response.json()  # type: ignore[no-any-return]


def job_reason(api: APIClient, organization: Organization, content: bytes,
               fmt: str = "jsonl", **fields: Any) -> str:
    """The failure_reason a job on this content fails with."""
    item = input_ready(organization, content, fmt=fmt)
    job_id = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b", **fields},
                      format="json").json()["id"]
    assert job_estimate(job_id=job_id) == JobStatus.FAILED
    return Job.objects.get(pk=job_id).failure_reason


@pytest.mark.django_db
def test_a_file_with_three_bad_rows_gets_all_three(api: APIClient,
                                                   organization: Organization) -> None:
    # given a 1,000-line file whose lines 2, 50 and 900 are bad
    content = with_bad_lines(1000, BAD)
    item = input_ready(organization, content)
    # when it is checked
    started = check_start(api, str(item.pk))
    assert started == {"id": started["id"], "status": "checking"}
    polled = api.get(f"{CHECKS}/{started['id']}").json()
    assert (polled["status"], polled["errors"]) == ("checking", [])
    body = checked(api, started["id"])
    # then every failing row is reported, in file order, with its line and custom_id
    assert body["status"] == "failed"
    assert [(e["line"], e["custom_id"]) for e in body["errors"]] == [
        (2, "row-2"), (50, None), (900, "row-1")]
    assert (body["row_count"], body["error_count"]) == (1000, 3)
    assert body["est_input_tok"] > 0
    # and each reason is the one a job would fail with, word for word
    assert body["errors"][0]["reason"] == job_reason(api, organization, BAD[2] + chat_row("x"))
    assert body["errors"][1]["reason"].startswith("Line 50: not valid JSON")
    assert body["errors"][2]["reason"] == (
        "Row 'row-1': custom_id is used by an earlier line; every row needs its own "
        "custom_id")
    assert body["errors"][2]["reason"] == job_reason(
        api, organization, chat_row("row-1") + chat_row("row-1"))


@pytest.mark.django_db
def test_a_clean_file_passes_with_its_rows_and_tokens_counted(
        api: APIClient, organization: Organization) -> None:
    content = b"".join(chat_row(f"r{i}") for i in range(5))
    item = input_ready(organization, content)
    body = checked(api, check_start(api, str(item.pk))["id"])
    assert (body["status"], body["row_count"], body["error_count"], body["errors"]) == (
        "passed", 5, 0, [])
    # the same count a job's estimate makes of the same file
    job = Job.objects.get(pk=api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b",
                                             "max_output_tokens": 10},
                                      format="json").json()["id"])
    assert job_estimate(job_id=job.pk) == JobStatus.COST_READY
    job.refresh_from_db()
    assert body["est_input_tok"] == job.est_input_tok
    assert list(body) == ["id", "status", "input_id", "model", "row_count", "est_input_tok",
                          "error_count", "errors", "created_at", "finished_at"]


@pytest.mark.django_db
def test_the_job_fields_are_checked_against_the_rows(api: APIClient,
                                                    organization: Organization) -> None:
    # A row that turns thinking off in a job with a reasoning budget fails the job (the
    # reference's reasoning_budget rule): the check says so for that row.
    content = chat_row("a") + chat_row("b", chat_template_kwargs={"enable_thinking": False})
    item = input_ready(organization, content)
    started = api.post(CHECKS, {"input_id": str(item.pk), "model": "qwen3.8-27b",
                                "reasoning_budget": 500}, format="json")
    assert started.status_code == 202, started.content
    body = checked(api, started.json()["id"])
    assert [(e["line"], e["custom_id"]) for e in body["errors"]] == [(2, "b")]


@pytest.mark.django_db
def test_at_most_1000_failing_rows_are_listed_and_all_are_counted(
        api: APIClient, organization: Organization) -> None:
    content = b"".join(chat_row(f"r{i}", [{"type": "hologram"}]) for i in range(1005))
    item = input_ready(organization, content)
    body = checked(api, check_start(api, str(item.pk))["id"])
    assert (len(body["errors"]), body["error_count"], body["row_count"]) == (1000, 1005, 1005)
    assert body["errors"][-1]["line"] == 1000


@pytest.mark.django_db
def test_blank_and_overlong_lines_are_reported_and_the_read_goes_on(
        api: APIClient, organization: Organization, settings: Settings) -> None:
    # given a blank line 2 and, on line 4, a line longer than any request may be
    model = model_get("gemma4-12b")
    assert model is not None
    errors = RowErrors(1000)
    from jobs.validation.core import FileContext

    limit = FileContext(JobOptions(model=model.id), len, None).line_max_bytes
    huge = b'{"custom_id": "big", "pad": "' + b"x" * (limit + 10) + b'"}\n'
    content = chat_row("a") + b"\n" + chat_row("b") + huge + chat_row("c", [{"type": "x"}])
    report = validate_jsonl(io.BytesIO(content), JobOptions(model=model.id), count_tokens=len,
                            errors=errors)
    assert [(e.line, e.custom_id) for e in errors.items] == [(2, None), (4, None), (5, "c")]
    assert errors.items[1].reason.startswith("Line 4: the line is longer than")
    assert (report.rows, errors.failed_rows) == (2, 2)
    # and without `errors` the same file stops at the first, as a job's estimate does
    with pytest.raises(RowRejected, match="Line 2: the line is blank"):
        validate_jsonl(io.BytesIO(content), JobOptions(model=model.id), count_tokens=len)


@pytest.mark.django_db
def test_a_file_fault_is_reported_without_a_line(api: APIClient,
                                                 organization: Organization) -> None:
    # given a parquet file with no column a chat row can come from
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"notes": ["a", "b"]}), buffer)
    item = input_ready(organization, buffer.getvalue(), fmt="parquet")
    body = checked(api, check_start(api, str(item.pk))["id"])
    # then the check fails on the whole file, with the reason a job would fail with
    assert body["status"] == "failed" and body["row_count"] is None
    assert body["errors"] == [{"line": None, "custom_id": None,
                               "reason": job_reason(api, organization, buffer.getvalue(),
                                                    fmt="parquet")}]


@pytest.mark.django_db
def test_parquet_rows_are_reported_by_row_index(api: APIClient,
                                                organization: Organization) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": ["a", "b", "a"], "prompt": ["hi", "there", "again"]}),
                   buffer)
    item = input_ready(organization, buffer.getvalue(), fmt="parquet")
    body = checked(api, check_start(api, str(item.pk))["id"])
    assert body["errors"] == [{"line": None, "custom_id": "a", "row_index": 2,
                               "reason": "Row 'a': id is used by an earlier row; every row "
                                         "needs its own id"}]
    assert body["row_count"] == 3


@pytest.mark.django_db
def test_an_input_that_is_not_the_format_it_claims_is_refused_as_a_submit_refuses_it(
        api: APIClient, organization: Organization) -> None:
    item = input_ready(organization, b'{"a": 1}\n', fmt="parquet")
    body = {"input_id": str(item.pk), "model": "gemma4-12b"}
    check = api.post(CHECKS, body, format="json")
    assert check.status_code == 400
    assert check.json() == api.post(JOBS, body, format="json").json()


@pytest.mark.django_db
def test_a_check_is_free_and_takes_no_approval_slot(api: APIClient,
                                                    organization: Organization) -> None:
    # given an organization whose approval queue is full
    for _ in range(APPROVAL_QUEUE_LIMIT):
        job_make(organization, status=JobStatus.COST_READY)
    before = credits_summary(organization=organization)
    entries = LedgerEntry.objects.filter(organization=organization).count()
    item = input_ready(organization, chat_row("a"))
    # a submit is refused, a check is not
    assert api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b"},
                    format="json").status_code == 429
    body = checked(api, check_start(api, str(item.pk))["id"])
    assert body["status"] == "passed"
    # and it created no job and moved no credits
    assert Job.objects.for_org(organization).count() == APPROVAL_QUEUE_LIMIT
    assert credits_summary(organization=organization) == before
    assert LedgerEntry.objects.filter(organization=organization).count() == entries


@pytest.mark.django_db
def test_the_submit_rules_402_403_421_apply(client_for: Any, settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    broke = organization_make()
    api = client_for(api_key_make(broke)[1])
    item = input_ready(broke, chat_row("a"))
    # 402: no credits, before the input is read
    response = api.post(CHECKS, {"input_id": str(item.pk), "model": "gemma4-12b"},
                        format="json")
    assert response.status_code == 402, response.content
    assert response.json() == api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b"},
                                       format="json").json()
    # 403: EU data without EU routing
    settings.ANEX_FREE_GRANT_CENTS = 100
    organization = organization_make()
    api = client_for(api_key_make(organization)[1])
    item = input_ready(organization, chat_row("a"))
    response = api.post(CHECKS, {"input_id": str(item.pk), "model": "gemma4-12b",
                                 "data_residency": "eu"}, format="json")
    assert response.status_code == 403
    assert "EU data routing is not enabled" in response.json()["detail"]
    # 421: an EU organization's check sent to the world API, and its check read there
    eu = organization_make(eu_data_routing=True)
    api = client_for(api_key_make(eu)[1])
    item = input_ready(eu, chat_row("a"), residency="eu")
    body = {"input_id": str(item.pk), "model": "gemma4-12b"}
    response = api.post(CHECKS, body, format="json")
    assert response.status_code == 421
    assert response.json()["residency"] == "eu"
    started = api.post(CHECKS, body, format="json", HTTP_HOST=EU_HOST)
    assert started.status_code == 202, started.content
    assert api.get(f"{CHECKS}/{started.json()['id']}").status_code == 421
    assert api.get(f"{CHECKS}/{started.json()['id']}", HTTP_HOST=EU_HOST).status_code == 200


@pytest.mark.django_db
def test_the_request_shape_is_checked_as_a_submit_checks_it(
        api: APIClient, organization: Organization) -> None:
    item = input_ready(organization, chat_row("a"))
    unknown = api.post(CHECKS, {"input_id": str(item.pk), "model": "gpt-9"}, format="json")
    assert unknown.status_code == 422 and "Unknown model 'gpt-9'" in unknown.json()["detail"]
    assert api.post(CHECKS, {"model": "gemma4-12b"}, format="json").status_code == 422
    bad_format = api.post(CHECKS, {"input_id": str(item.pk), "model": "gemma4-12b",
                                   "response_format": {"type": "yaml"}}, format="json")
    assert bad_format.status_code == 400


@pytest.mark.django_db
def test_checks_are_rate_limited_per_organization(api: APIClient, organization: Organization,
                                                  settings: Settings, client_for: Any) -> None:
    settings.ANEX_CHECKS_PER_MINUTE = 2
    item = input_ready(organization, chat_row("a"))
    body = {"input_id": str(item.pk), "model": "gemma4-12b"}
    assert [api.post(CHECKS, body, format="json").status_code for _ in range(2)] == [202, 202]
    # another key of the same organization shares the limit
    other = client_for(api_key_make(organization)[1])
    limited = other.post(CHECKS, body, format="json")
    assert limited.status_code == 429
    assert int(limited["Retry-After"]) >= 1
    assert limited.json()["error"]["code"] == "rate_limit_exceeded"
    # another organization does not
    theirs = organization_make()
    their_item = input_ready(theirs, chat_row("a"))
    assert client_for(api_key_make(theirs)[1]).post(
        CHECKS, {"input_id": str(their_item.pk), "model": "gemma4-12b"},
        format="json").status_code == 202


@pytest.mark.django_db
def test_an_idempotency_key_replays_the_check(api: APIClient,
                                              organization: Organization) -> None:
    item = input_ready(organization, chat_row("a"))
    body = {"input_id": str(item.pk), "model": "gemma4-12b"}
    first = api.post(CHECKS, body, format="json", HTTP_IDEMPOTENCY_KEY="check-1")
    again = api.post(CHECKS, body, format="json", HTTP_IDEMPOTENCY_KEY="check-1")
    assert (first.status_code, again.status_code) == (202, 202)
    assert again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    assert PreflightCheck.objects.for_org(organization).count() == 1


@pytest.mark.django_db
def test_another_organizations_check_and_input_are_404(api: APIClient) -> None:
    theirs = organization_make()
    their_item = input_ready(theirs, chat_row("a"))
    response = api.post(CHECKS, {"input_id": str(their_item.pk), "model": "gemma4-12b"},
                        format="json")
    assert response.status_code == 404
    check = PreflightCheck.objects.create(organization=theirs, input=their_item,
                                          model="gemma4-12b")
    for check_id in (check.pk, "not-a-uuid"):
        response = api.get(f"{CHECKS}/{check_id}")
        assert (response.status_code, response.json()) == (404, {"detail": "Check not found"})


@pytest.mark.django_db
def test_a_check_settles_once(api: APIClient, organization: Organization) -> None:
    item = input_ready(organization, chat_row("a"))
    check_id = check_start(api, str(item.pk))["id"]
    assert check_run(check_id=check_id) == CheckStatus.PASSED
    assert check_run(check_id=check_id) is None  # a redelivered message changes nothing
    finished = PreflightCheck.objects.get(pk=check_id).finished_at
    assert finished is not None and finished <= timezone.now()


@pytest.mark.django_db(transaction=True)
def test_the_actor_runs_the_check_on_a_worker(client_for: Any) -> None:
    organization = organization_make()
    api = client_for(api_key_make(organization)[1])
    item = input_ready(organization, with_bad_lines(60, BAD))
    broker_flush()
    check_id = api.post(CHECKS, {"input_id": str(item.pk), "model": "gemma4-12b"},
                        format="json").json()["id"]
    with running_worker():
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and \
                PreflightCheck.objects.get(pk=check_id).status == CheckStatus.CHECKING:
            time.sleep(0.02)
    body = api.get(f"{CHECKS}/{check_id}").json()
    assert [e["line"] for e in body["errors"]] == [2, 50]


def test_the_openapi_document_describes_checks() -> None:
    document = APIClient().get("/openapi.json").json()
    create = document["paths"]["/batch/v1/checks"]["post"]
    assert create["operationId"] == "createCheck"
    assert any(p["name"] == "Idempotency-Key" for p in create["parameters"])
    get = document["paths"]["/batch/v1/checks/{check_id}"]["get"]
    assert get["operationId"] == "getCheck"
    schema = get["responses"]["200"]["content"]["application/json"]["schema"]
    assert schema["properties"]["errors"]["maxItems"] == 1000



@pytest.mark.django_db
def test_a_check_whose_read_was_lost_is_failed_by_the_sweep(
        api: APIClient, organization: Organization) -> None:
    item = input_ready(organization, chat_row("a"))
    lost = check_start(api, str(item.pk))["id"]
    fresh = check_start(api, str(item.pk))["id"]
    PreflightCheck.objects.filter(pk=lost).update(
        created_at=timezone.now() - CHECK_STALE - timedelta(minutes=1))
    assert checks_settle_stale() == 1
    body = api.get(f"{CHECKS}/{lost}").json()
    assert (body["status"], body["errors"]) == ("failed", [
        {"line": None, "custom_id": None, "reason": CHECK_FAILED_INTERNALLY}])
    assert api.get(f"{CHECKS}/{fresh}").json()["status"] == "checking"
    assert check_run(check_id=lost) is None  # a late worker changes nothing


# -- issue 22, L10: a check's quoted rows go with its input's data ------------------------


def secret_row(custom_id: str) -> bytes:
    return chat_row(custom_id, [{"type": "hologram", "text": "my card is 4111 1111"}])


@pytest.mark.django_db
def test_deleting_a_jobs_data_deletes_the_rows_its_inputs_checks_quote(
        api: APIClient, organization: Organization) -> None:
    # given a check of an input whose failing rows it quotes, and a finished job on it
    item = input_ready(organization, chat_row("fine") + secret_row("card-row"))
    body = checked(api, check_start(api, str(item.pk))["id"])
    assert [error["custom_id"] for error in body["errors"]] == ["card-row"]
    job = job_make(organization, status=JobStatus.DONE)
    Job.objects.filter(pk=job.pk).update(input=item)
    # when the job's data is deleted
    assert api.delete(f"{JOBS}/{job.pk}/data").status_code == 200
    # then the check no longer quotes the rows (its verdict and counts stay)
    after = api.get(f"{CHECKS}/{body['id']}").json()
    assert after["errors"] == []
    assert (after["status"], after["error_count"], after["row_count"]) == ("failed", 1, 2)
    assert "card-row" not in json.dumps(after) and "4111" not in json.dumps(after)


@pytest.mark.django_db
def test_an_expired_inputs_checks_lose_their_quoted_rows(
        api: APIClient, organization: Organization) -> None:
    from jobs.models import Input
    from jobs.services.inputs import inputs_expire

    item = input_ready(organization, secret_row("card-row"))
    check_id = checked(api, check_start(api, str(item.pk))["id"])["id"]
    other = input_ready(organization, secret_row("kept-row"))
    kept_id = checked(api, check_start(api, str(other.pk))["id"])["id"]
    Input.objects.filter(pk=item.pk).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert inputs_expire() == 1
    assert api.get(f"{CHECKS}/{check_id}").json()["errors"] == []
    assert [e["custom_id"] for e in api.get(f"{CHECKS}/{kept_id}").json()["errors"]] == [
        "kept-row"]


@pytest.mark.django_db
def test_checks_in_flight_are_capped_per_organization(api: APIClient, organization: Organization,
                                                      settings: Settings,
                                                      client_for: Any) -> None:
    # Issue 22, M4: the per-minute start rate let an organization keep ten whole-input reads
    # going at once, minute after minute, for free.
    settings.ANEX_CHECKS_IN_FLIGHT = 2
    item = input_ready(organization, chat_row("a"))
    body = {"input_id": str(item.pk), "model": "gemma4-12b"}
    # given two checks still reading (nothing consumes their messages here)
    first, _ = (check_start(api, str(item.pk)) for _ in range(2))
    # when a third is started, from another key of the same organization
    other = client_for(api_key_make(organization)[1])
    refused = other.post(CHECKS, body, format="json")
    # then it is refused with the reference's rate-limit envelope, nothing recorded
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1
    assert refused.json()["error"] == {
        "code": "rate_limit_exceeded",
        "message": "Too many preflight checks in flight: this organization already has 2 "
                   "still checking (the limit is 2). Wait for one to finish (GET "
                   "/checks/{id}), then retry."}
    assert PreflightCheck.objects.filter(organization=organization).count() == 2
    # another organization is not held by it
    theirs = organization_make()
    their_item = input_ready(theirs, chat_row("a"))
    assert client_for(api_key_make(theirs)[1]).post(
        CHECKS, {"input_id": str(their_item.pk), "model": "gemma4-12b"},
        format="json").status_code == 202
    # and once one settles, the next is admitted
    checked(api, first["id"])
    assert other.post(CHECKS, body, format="json").status_code == 202


def test_checks_run_on_their_own_queue_after_estimates() -> None:
    """A worker holding both takes estimates (paid work) first: Dramatiq orders the
    messages a worker holds by their actor's priority, a higher number later."""
    from jobs import dispatch, tasks

    assert dispatch.ACTOR_QUEUES["check_run_task"] == dispatch.CHECKS != dispatch.ESTIMATE
    assert tasks.check_run_task.queue_name == dispatch.CHECKS
    assert tasks.check_run_task.priority > tasks.job_estimate_task.priority
