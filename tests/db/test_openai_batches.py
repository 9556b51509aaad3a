"""Issue 25: the OpenAI-compatible batch surface (/openai/v1), driven by the official `openai`
package, unchanged, against a running server (pytest-django's live_server) on the test
database. The estimate is the real one (the model's tokenizer counts every row): the
messages the services send are caught here and their work run by the test, as the workers
would run it; the runs themselves, on real engines, are tests/engine/test_openai_engine.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection
from pytest_django import Settings

from billing.models import LedgerEntry
from console.models import Organization
from jobs.constants import FailureCode, JobStatus
from jobs.models import Job
from jobs.services.estimation import job_estimate
from openai_api.models import OpenAIBatch, OpenAIFile
from tests.dispatched import Sent, dispatch_catch
from tests.factories import api_key_make, organization_make
from tests.lazy import lazy_module
from tests.workers import until

if TYPE_CHECKING:
    import httpx
    import openai
    from openai import OpenAI
else:  # imported by the first test that uses them, not by every worker's collection
    httpx, openai = lazy_module("httpx"), lazy_module("openai")

pytestmark = pytest.mark.django_db(transaction=True)
EMBED = "qwen3-embedding-8b"
LAYA = "laya"


@pytest.fixture(autouse=True)
def served(checkpoints: Path, settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000


@pytest.fixture
def estimates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The jobs whose estimate was sent (nothing consumes it here: `estimated` runs it)."""
    found: list[str] = []

    def record(sent: Sent) -> None:
        found.append(sent.id)

    dispatch_catch(monkeypatch, record, "job_estimate_task", "job_start_task")
    return found


def client_for(live_server: Any, plaintext: str, **options: Any) -> OpenAI:
    return openai.OpenAI(base_url=f"{live_server.url}/openai/v1", api_key=plaintext, **options)


@pytest.fixture
def tenant() -> tuple[Organization, str]:
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    return organization, plaintext


@pytest.fixture
def client(live_server: Any, tenant: tuple[Organization, str]) -> OpenAI:
    return client_for(live_server, tenant[1])


def line(custom_id: str, model: str = EMBED, text: str = "a plain text string",
         url: str = "/v1/embeddings") -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": url,
            "body": {"model": model, "input": text}}


def jsonl(*rows: dict[str, Any] | str) -> bytes:
    return b"".join((row if isinstance(row, str) else json.dumps(row)).encode() + b"\n"
                    for row in rows)


def decision(custom_id: str) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/systemone",
            "body": {"model": LAYA, "state": "We were billed twice for March.",
                     "questions": {"urgent": {"type": "noul",
                                              "instructions": "Is it urgent?"}}}}


def uploaded(client: OpenAI, content: bytes, name: str = "requests.jsonl") -> str:
    return client.files.create(file=(name, content), purpose="batch").id


def estimated(batch_id: str) -> Job:
    """Run the estimate the batch's job was sent for, as the estimate worker does."""
    job = OpenAIBatch.objects.get(pk=batch_id).job
    assert job is not None
    job_estimate(job_id=job.pk)
    job.refresh_from_db()
    return job


def test_a_file_round_trips_its_bytes_lists_and_deletes(client: OpenAI) -> None:
    content = jsonl(line("r1"), line("r2"))
    created = client.files.create(file=("my-requests.jsonl", content), purpose="batch")
    assert created.id.startswith("file-")
    assert (created.object, created.bytes, created.filename, created.purpose) == (
        "file", len(content), "my-requests.jsonl", "batch")
    assert created.expires_at is not None and created.expires_at - created.created_at == \
        7 * 24 * 3600
    # the same storage as an anex input, frozen on its bytes
    stored = OpenAIFile.objects.get(pk=created.id)
    assert stored.input is not None and stored.input.status == "ready"
    assert stored.input.size_bytes == len(content)

    assert client.files.retrieve(created.id).model_dump() == created.model_dump()
    assert client.files.content(created.id).read() == content
    assert [file.id for file in client.files.list()] == [created.id]

    deleted = client.files.delete(created.id)
    assert (deleted.id, deleted.object, deleted.deleted) == (created.id, "file", True)
    with pytest.raises(openai.NotFoundError) as missing:
        client.files.retrieve(created.id)
    assert missing.value.body == {"message": f"No such File object: {created.id}",  # type: ignore[comparison-overlap]
                                  "type": "invalid_request_error", "code": None, "param": None}
    assert list(client.files.list()) == []
    stored.input.refresh_from_db()
    assert stored.input.status == "expired" and stored.input.deleted_at is not None


def test_other_purposes_and_a_missing_purpose_are_400(client: OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("a.jsonl", jsonl(line("r1"))), purpose="fine-tune")
    assert refused.value.code is None and refused.value.param == "purpose"
    assert "purpose 'batch'" in refused.value.message
    assert OpenAIFile.objects.count() == 0


def test_a_batch_is_validating_then_approved_at_its_estimate_and_held(
        client: OpenAI, tenant: tuple[Organization, str], estimates: list[str]) -> None:
    organization, _ = tenant
    file_id = uploaded(client, jsonl(line("r1"), line("r2", text="Say hello in French.")))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h", metadata={"team": "search"})
    assert batch.id.startswith("batch_")
    assert (batch.status, batch.model, batch.endpoint, batch.input_file_id) == (
        "validating", EMBED, "/v1/embeddings", file_id)
    assert batch.metadata == {"team": "search"} and batch.errors is None
    assert batch.expires_at == batch.created_at + 24 * 3600
    job_id = batch.model_dump()["anex_job_id"]
    job = Job.objects.get(pk=job_id)
    assert job.approve_at_estimate and job.collect_row_errors and job.row_model
    assert job.organization_id == organization.pk and job.model == EMBED
    assert estimates == [job_id]

    job = estimated(batch.id)
    # no approval step: priced and approved at once, the estimate held
    assert job.status == JobStatus.IN_PROGRESS, job.failure_reason
    assert LedgerEntry.objects.get(job_id=job.pk, kind="hold").held_delta == job.est_cost_cents
    again = client.batches.retrieve(batch.id)
    assert again.status == "in_progress"
    assert again.in_progress_at is not None
    assert again.request_counts is not None and again.request_counts.total == 2


def test_list_pages_newest_first_with_after(client: OpenAI, estimates: list[str]) -> None:
    file_id = uploaded(client, jsonl(line("r1")))
    made = [client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h").id for _ in range(5)]
    first = client.batches.list(limit=2)
    assert [batch.id for batch in first.data] == made[::-1][:2]
    assert first.has_more is True
    second = client.batches.list(limit=2, after=first.data[-1].id)
    assert [batch.id for batch in second.data] == made[::-1][2:4]
    last = client.batches.list(limit=2, after=second.data[-1].id)
    assert [batch.id for batch in last.data] == made[:1] and last.has_more is False
    # the SDK's own paging follows `after` to the end
    assert [batch.id for batch in client.batches.list(limit=2)] == made[::-1]


def test_a_file_with_bad_lines_fails_the_batch_naming_every_line(
        client: OpenAI, estimates: list[str]) -> None:
    content = jsonl(line("r1"), "{not json", line("r1"), line("r4", url="/v1/chat/completions"),
                    line("r5"))
    batch = client.batches.create(input_file_id=uploaded(client, content),
                                  endpoint="/v1/embeddings", completion_window="24h")
    assert batch.status == "validating"
    job = estimated(batch.id)
    assert job.status == JobStatus.FAILED and job.failure_code == FailureCode.INVALID_INPUT
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.failed_at is not None
    assert failed.errors is not None
    found = [(error.code, error.line) for error in failed.errors.data or []]
    assert found == [("invalid_json_line", 2), ("duplicate_custom_id", 3),
                     ("url_mismatch", 4)]
    assert all(error.message for error in failed.errors.data or [])
    assert failed.output_file_id is None and failed.error_file_id is None
    assert not LedgerEntry.objects.filter(job_id=job.pk).exists()  # nothing held or billed


def test_two_models_in_one_file_fail_the_batch_naming_the_line(
        client: OpenAI, estimates: list[str]) -> None:
    content = jsonl(line("r1"), line("r2"), line("r3", model="qwen3-vl-embedding-2b"))
    batch = client.batches.create(input_file_id=uploaded(client, content),
                                  endpoint="/v1/embeddings", completion_window="24h")
    assert batch.model == EMBED
    estimated(batch.id)
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.errors is not None
    [error] = failed.errors.data or []
    assert (error.code, error.line) == ("model_mismatch", 3)
    assert "qwen3-vl-embedding-2b" in (error.message or "")


def test_an_empty_file_and_a_model_for_another_endpoint_fail_at_once(
        client: OpenAI, estimates: list[str]) -> None:
    empty = client.batches.create(input_file_id=uploaded(client, b""),
                                  endpoint="/v1/embeddings", completion_window="24h")
    assert empty.status == "failed" and empty.errors is not None
    assert [error.code for error in empty.errors.data or []] == ["empty_file"]
    assert empty.model_dump()["anex_job_id"] is None
    chat = client.batches.create(input_file_id=uploaded(client, jsonl(line("r1"))),
                                 endpoint="/v1/chat/completions", completion_window="24h")
    assert chat.status == "failed" and chat.errors is not None
    assert [(error.code, error.line) for error in chat.errors.data or []] == [
        ("url_mismatch", 1)]
    assert estimates == [] and not Job.objects.exists()


def test_another_organizations_file_and_batch_are_not_found(
        live_server: Any, client: OpenAI, estimates: list[str]) -> None:
    file_id = uploaded(client, jsonl(line("r1")))
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h")
    _key, other_key = api_key_make(organization_make())
    other = client_for(live_server, other_key)
    for attempt in (lambda: other.files.retrieve(file_id),
                    lambda: other.files.content(file_id),
                    lambda: other.files.delete(file_id),
                    lambda: other.batches.retrieve(batch.id),
                    lambda: other.batches.cancel(batch.id),
                    lambda: other.batches.create(input_file_id=file_id,
                                                 endpoint="/v1/embeddings",
                                                 completion_window="24h")):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert list(other.batches.list()) == [] and list(other.files.list()) == []
    assert OpenAIBatch.objects.count() == 1
    assert client.files.retrieve(file_id).id == file_id  # untouched


def test_cancel_while_validating_stops_it_unbilled_and_a_finished_one_is_unchanged(
        client: OpenAI, estimates: list[str]) -> None:
    batch = client.batches.create(input_file_id=uploaded(client, jsonl(line("r1"))),
                                  endpoint="/v1/embeddings", completion_window="24h")
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at is not None
    job = estimated(batch.id)
    assert job.status == JobStatus.CANCELLED and job.approved_at is None
    cancelled = client.batches.retrieve(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert not LedgerEntry.objects.filter(job_id=job.pk).exists()
    assert client.batches.cancel(batch.id).model_dump() == cancelled.model_dump()


def test_without_credits_an_upload_is_insufficient_quota_and_an_unfunded_batch_fails(
        live_server: Any, settings: Settings, estimates: list[str]) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    _key, broke = api_key_make(organization_make())
    calls: list[httpx.Request] = []
    counting = httpx.Client(event_hooks={"request": [calls.append]})
    with pytest.raises(openai.RateLimitError) as refused:
        client_for(live_server, broke, http_client=counting).files.create(
            file=("a.jsonl", jsonl(line("r1"))), purpose="batch")
    assert refused.value.code == "insufficient_quota"
    assert refused.value.response.headers["x-should-retry"] == "false"
    assert len(calls) == 1  # not retried
    # one credit covers the upload, not laya's five-credit minimum: failed, never waiting
    settings.ANEX_FREE_GRANT_CENTS = 1
    _key, poor = api_key_make(organization_make())
    client = client_for(live_server, poor)
    batch = client.batches.create(input_file_id=uploaded(client, jsonl(decision("t1"))),
                                  endpoint="/v1/systemone",  # type: ignore[arg-type]
                                  completion_window="24h")  # anex's decisions: an extra
    job = estimated(batch.id)
    assert job.status == JobStatus.CANCELLED
    assert job.failure_code == FailureCode.INSUFFICIENT_CREDITS
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.errors is not None
    [error] = failed.errors.data or []
    assert error.code == "insufficient_credits"
    assert (error.message or "").startswith("The batch needs 5 credits held to run.")
    assert "1 are available" in (error.message or "")


def test_a_retried_create_with_an_idempotency_key_makes_one_batch(
        client: OpenAI, estimates: list[str]) -> None:
    file_id = uploaded(client, jsonl(line("r1")))
    made = [client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                  completion_window="24h",
                                  extra_headers={"Idempotency-Key": "create-once"})
            for _ in range(2)]
    assert made[0].id == made[1].id and OpenAIBatch.objects.count() == 1
    assert len(estimates) == 1
    with pytest.raises(openai.UnprocessableEntityError):  # the key with another body
        client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                              completion_window="24h", metadata={"x": "y"},
                              extra_headers={"Idempotency-Key": "create-once"})


def test_errors_are_openais_envelope_and_the_request_id_is_echoed(
        live_server: Any, client: OpenAI) -> None:
    with pytest.raises(openai.AuthenticationError) as refused:
        client_for(live_server, "sk-not-a-key").batches.list()
    assert refused.value.code == "invalid_api_key"
    assert refused.value.body["type"] == "invalid_request_error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as unknown:
        client.batches.retrieve("batch_nope")
    assert unknown.value.request_id and unknown.value.request_id.startswith("req_")
    raw = client.batches.with_raw_response.list(extra_headers={"X-Request-ID": "mine-1"})
    assert raw.request_id == "mine-1"
    with pytest.raises(openai.BadRequestError) as invalid:
        client.batches.create(input_file_id="file-x", endpoint="/v1/embeddings",
                              completion_window="48h")  # type: ignore[arg-type]
    assert invalid.value.param == "completion_window"


def test_an_upload_past_the_body_limit_streams_to_storage_and_past_the_cap_is_413(
        client: OpenAI, settings: Settings) -> None:
    settings.ANEX_API_MAX_BODY_BYTES = 64 * 1024
    settings.ANEX_INPUT_MAX_BYTES = 1024 * 1024
    content = jsonl(*(line(f"r{i}", text="x" * 400) for i in range(1500)))
    assert settings.ANEX_API_MAX_BODY_BYTES < len(content) < settings.ANEX_INPUT_MAX_BYTES
    created = client.files.create(file=("big.jsonl", content), purpose="batch")
    assert created.bytes == len(content)
    assert client.files.content(created.id).read() == content
    # over the cap by less than a form's framing: the body is let in and refused as its
    # bytes pass the cap on their way to storage, and nothing is kept
    over = b"y" * (settings.ANEX_INPUT_MAX_BYTES + 10_000)
    with pytest.raises(openai.APIStatusError) as refused:
        client.files.create(file=("over.jsonl", over), purpose="batch")
    assert refused.value.status_code == 413
    assert OpenAIFile.objects.count() == 1
    # and a body of any other operation keeps the API's limit, in OpenAI's envelope
    with pytest.raises(openai.APIStatusError) as large:
        client.batches.create(input_file_id=created.id, endpoint="/v1/embeddings",
                              completion_window="24h",
                              extra_body={"padding": "z" * 70 * 1024})
    assert large.value.status_code == 413
    assert large.value.body["type"] == "invalid_request_error"  # type: ignore[index]


def held_until(done: Callable[[], bool], timeout: float = 30) -> None:
    """Hold a request on the live server until done() (a sync point for a test's other
    request, where a fixed sleep would have to outlast it on the slowest machine)."""
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.02)


def key_waited_on() -> bool:
    """Whether another request waits on this request's transaction: on the Idempotency-Key
    it has inserted and not committed yet (jobs.idempotency._insert)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted "
                       "AND pg_backend_pid() = ANY(pg_blocking_pids(pid)))")
        (waited_on,) = cursor.fetchone() or (False,)
    return bool(waited_on)


@pytest.mark.parametrize("keyed", [True, False])
def test_a_create_that_timed_out_and_was_retried_makes_one_batch_with_a_key(
        live_server: Any, tenant: tuple[Organization, str], estimates: list[str],
        monkeypatch: pytest.MonkeyPatch, keyed: bool) -> None:
    import openai_api.api

    # the first create is slow: the SDK gives up on it after a second and sends it again,
    # while the server is still making it (held until the retry is on the server: making
    # its own batch without a key, waiting on the first's key with one)
    real, calls = openai_api.api.batch_create, []

    def slow_first(**kwargs: Any) -> Any:
        calls.append(kwargs["input_file_id"])
        if len(calls) == 1:
            held_until(key_waited_on if keyed else lambda: len(calls) == 2)
        return real(**kwargs)

    monkeypatch.setattr(openai_api.api, "batch_create", slow_first)
    # (the SDK's retries after a tenth of its half a second)
    monkeypatch.setattr("openai._base_client.INITIAL_RETRY_DELAY", 0.05)
    client = client_for(live_server, tenant[1], timeout=1.0, max_retries=2)
    file_id = uploaded(client, jsonl(line("r1")))
    headers = {"Idempotency-Key": "create-after-timeout"} if keyed else {}
    answer = client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                                   completion_window="24h", extra_headers=headers)
    # the first request runs to its end on the server, whatever the client did
    until(lambda: len(calls) == 2 and OpenAIBatch.objects.count() == 2 if not keyed
          else OpenAIBatch.objects.count() == 1, timeout=30)
    time.sleep(0.5)
    made = list(OpenAIBatch.objects.values_list("id", flat=True))
    if keyed:
        # the retry waited for the first request and was answered its batch
        assert made == [answer.id] and len(calls) == 1 and len(estimates) == 1
    else:
        # without a key each attempt is a new request: the reason to send one
        assert len(made) == 2 and len(calls) == 2


def test_the_eu_host_serves_the_eu_data_and_the_other_host_names_it(
        live_server: Any, settings: Settings, estimates: list[str]) -> None:
    port = live_server.url.rsplit(":", 1)[1]
    settings.ANEX_EU_API_ORIGIN = f"http://127.0.0.1:{port}"
    settings.ALLOWED_HOSTS = [*settings.ALLOWED_HOSTS, "127.0.0.1", "localhost"]
    organization = organization_make(eu_data_routing=True)
    _key, plaintext = api_key_make(organization)
    eu = openai.OpenAI(base_url=f"{settings.ANEX_EU_API_ORIGIN}/openai/v1", api_key=plaintext)
    world = client_for(live_server, plaintext)
    content = jsonl(line("r1"))
    file = eu.files.create(file=("eu.jsonl", content), purpose="batch")
    stored = OpenAIFile.objects.get(pk=file.id)
    assert stored.input is not None and stored.input.data_residency == "eu"
    assert eu.files.content(file.id).read() == content
    batch = eu.batches.create(input_file_id=file.id, endpoint="/v1/embeddings",
                              completion_window="24h")
    assert Job.objects.get(pk=batch.model_dump()["anex_job_id"]).data_residency == "eu"
    for attempt in (lambda: world.files.create(file=("eu.jsonl", content), purpose="batch"),
                    lambda: world.files.content(file.id)):
        with pytest.raises(openai.APIStatusError) as refused:
            attempt()
        assert refused.value.status_code == 421
        assert settings.ANEX_EU_API_ORIGIN in refused.value.message
    assert world.batches.retrieve(batch.id).id == batch.id  # a poll carries no data


def test_the_surface_is_in_the_openapi_document(client: OpenAI) -> None:
    document = httpx.get(f"{str(client.base_url).removesuffix('/openai/v1/')}/openapi.json"
                         ).json()
    operations = {operation["operationId"] for path, item in document["paths"].items()
                  if path.startswith("/openai/v1/") for operation in item.values()}
    assert operations == {"openaiCreateFile", "openaiListFiles", "openaiGetFile",
                          "openaiDeleteFile", "openaiGetFileContent", "openaiCreateBatch",
                          "openaiListBatches", "openaiGetBatch", "openaiCancelBatch"}
    schemas = document["components"]["schemas"]
    status = schemas["BatchOut"]["properties"]["status"]
    status = schemas[status["$ref"].rsplit("/", 1)[1]] if "$ref" in status else status
    assert status["enum"] == ["validating", "failed", "in_progress", "finalizing",
                                       "completed", "expired", "cancelling", "cancelled"]


def test_metadata_past_sixteen_pairs_is_400(client: OpenAI) -> None:
    file_id = uploaded(client, jsonl(line("r1")))
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=file_id, endpoint="/v1/embeddings",
                              completion_window="24h",
                              metadata={f"k{i}": "v" for i in range(17)})
    assert refused.value.param == "metadata"
    assert OpenAIBatch.objects.count() == 0


def test_a_key_whose_spend_budget_does_not_cover_the_hold_fails_the_batch(
        live_server: Any, estimates: list[str]) -> None:
    organization = organization_make()
    _key, plaintext = api_key_make(organization, spend_budget_cents=2)
    client = client_for(live_server, plaintext)
    batch = client.batches.create(input_file_id=uploaded(client, jsonl(decision("t1"))),
                                  endpoint="/v1/systemone",  # type: ignore[arg-type]
                                  completion_window="24h")
    job = estimated(batch.id)
    assert (job.status, job.failure_code) == (JobStatus.CANCELLED,
                                              FailureCode.INSUFFICIENT_CREDITS)
    failed = client.batches.retrieve(batch.id)
    assert failed.status == "failed" and failed.errors is not None
    [error] = failed.errors.data or []
    assert error.code == "insufficient_credits"
    assert "spend budget" in (error.message or "") and "2-credit budget" in (error.message or "")
    assert not LedgerEntry.objects.filter(job_id=job.pk).exists()


def test_a_duplicate_still_in_flight_is_409_and_the_sdk_does_not_retry_it(
        live_server: Any, tenant: tuple[Organization, str], estimates: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    import jobs.idempotency
    import openai_api.api

    monkeypatch.setattr(jobs.idempotency, "WAIT_SECONDS", 0.3)  # the wait on the first's key
    real, calls, answered = openai_api.api.batch_create, [], threading.Event()

    def slow_first(**kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            answered.wait(30)  # still making its batch when the duplicate is answered
        return real(**kwargs)

    monkeypatch.setattr(openai_api.api, "batch_create", slow_first)
    file_id = uploaded(client_for(live_server, tenant[1]), jsonl(line("r1")))
    body = {"input_file_id": file_id, "endpoint": "/v1/embeddings",
            "completion_window": "24h"}
    headers = {"Idempotency-Key": "in-flight"}
    first = client_for(live_server, tenant[1], timeout=0.3, max_retries=0)
    with pytest.raises(openai.APITimeoutError):
        first.batches.create(**body, extra_headers=headers)  # type: ignore[arg-type]
    until(lambda: len(calls) == 1, timeout=30)  # the first holds its key on the server
    sent: list[httpx.Request] = []
    second = client_for(live_server, tenant[1], max_retries=2,
                        http_client=httpx.Client(event_hooks={"request": [sent.append]}))
    try:
        with pytest.raises(openai.ConflictError) as conflict:
            second.batches.create(**body, extra_headers=headers)  # type: ignore[arg-type]
    finally:
        answered.set()
    assert conflict.value.response.headers["x-should-retry"] == "false"
    assert conflict.value.response.headers["Retry-After"] == "1"
    assert "still being processed" in conflict.value.message
    assert len(sent) == 1  # not retried
    until(lambda: OpenAIBatch.objects.count() == 1, timeout=30)
    # once the first has answered, the same request replays its batch
    replayed = second.batches.create(**body, extra_headers=headers)  # type: ignore[arg-type]
    assert replayed.id == OpenAIBatch.objects.get().id and len(calls) == 1


def test_files_page_either_way_and_filter_by_purpose(client: OpenAI) -> None:
    made = [uploaded(client, jsonl(line(f"r{i}")), name=f"f{i}.jsonl") for i in range(3)]
    assert [file.id for file in client.files.list()] == made[::-1]
    oldest = client.files.list(order="asc", limit=2)
    assert [file.id for file in oldest.data] == made[:2] and oldest.has_more
    assert [file.id for file in client.files.list(order="asc", after=made[1])] == made[2:]
    assert [file.id for file in client.files.list(purpose="batch_output")] == []
    assert len(client.files.list(purpose="batch").data) == 3
