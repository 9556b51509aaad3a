"""GET /batch/v1/jobs/{id}/rows (issue 44 item 1): a job's finished rows read a page at a
time while it runs, in file order as far as they are contiguous, with the next cursor and
the rows finished ahead of it; a running page's lines are the result file's lines less
their cost (the final line is the running line with the cost member put before its
closing brace), and once the job has ended its pages are the result file, byte for byte.

Through the API, the real services, PostgreSQL and the local storage; chunks are finished
as chunk_run finishes them (tests/chunks.py), or run by chunk_run on a replaced engine for
a grouped plan (tests/db/test_grouped_plan.py's)."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from inference.constants import RowOutcome
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Job
from jobs.services import pages
from jobs.services.lifecycle import job_cancel
from jobs.services.running import chunk_run, job_finalize, job_start
from jobs.storage import storage_for
from tests.chunks import chunk_done, row_record
from tests.db import test_grouped_plan as grouped
from tests.db.test_grouped_plan import fake  # noqa: F401
from tests.db.test_row_cost import approved, usage_of
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, api_key_make, job_make, organization_make

JOBS = "/batch/v1/jobs"
CHUNK_ROWS = 50


@pytest.fixture(autouse=True)
def setup(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = CHUNK_ROWS


def outcome_of(index: int) -> RowOutcome:
    return RowOutcome.ERROR if index % 11 == 4 else RowOutcome.SUCCESS


def complete(chunk: Chunk) -> None:
    chunk_done(chunk, [row_record(index, f"r{index}", outcome_of(index), usage_of(index),
                                  answer=f"answer {index} \u00e9\u2603")
                       for index in range(chunk.first_row, chunk.first_row + chunk.row_count)])


def page(api: APIClient, job: Job, after: int | None = None, limit: int | None = None,
         ) -> tuple[bytes, int, int]:
    """A page's body, Anex-Next-After and Anex-Rows-Ahead; asserts it is a 200 of JSONL
    holding exactly the lines its cursor says."""
    query = {k: v for k, v in (("after", after), ("limit", limit)) if v is not None}
    response = api.get(f"{JOBS}/{job.pk}/rows", query)
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/jsonl"
    assert response.streaming
    body = b"".join(response.streaming_content)  # type: ignore[attr-defined]
    following = int(response["Anex-Next-After"])
    assert body.count(b"\n") == following - (after or 0)
    return body, following, int(response["Anex-Rows-Ahead"])


def ids(body: bytes) -> list[str]:
    return [json.loads(line)["custom_id"] for line in body.splitlines()]


def result_bytes(job: Job) -> bytes:
    job.refresh_from_db()
    return storage_for(job.data_residency).path(job.result_key).read_bytes()  # type: ignore[attr-defined]


def assert_costed(running: bytes, final: bytes) -> None:
    """Each final line is its running line with the cost member before its closing
    brace, and nothing else differs."""
    finals, runnings = final.splitlines(keepends=True), running.splitlines(keepends=True)
    assert len(finals) == len(runnings)
    for run, end in zip(runnings, finals, strict=True):
        cost = json.loads(end)["cost"]["credits"]
        assert end == run[:-2] + b',"cost":{"credits":' + orjson.dumps(cost) + b"}}\n"
        assert "cost" not in json.loads(run)


def all_pages(api: APIClient, job: Job, limit: int) -> bytes:
    read, after = b"", 0
    while True:
        body, after, ahead = page(api, job, after, limit)
        read += body
        if not body:
            assert ahead == 0
            return read


@pytest.mark.django_db
def test_a_running_jobs_rows_are_read_in_order_while_later_chunks_are_pending(
        api: APIClient, organization: Organization, sent: list[str]) -> None:
    # given a running job of 230 rows in 5 chunks of 50, none finished
    job = approved(organization, 230, est=10_000)
    job_start(job_id=job.pk)
    chunks = list(job.chunks.order_by("index"))
    assert len(chunks) == 5
    refused = api.get(f"{JOBS}/{job.pk}/rows")
    assert refused.status_code == 409
    assert refused.json()["detail"] == "This job is in_progress: no row has finished yet."
    progress = api.get(f"{JOBS}/{job.pk}/progress").json()
    assert progress["rows_readable_after"] == 0

    # when its first and third chunks finish
    complete(chunks[0])
    complete(chunks[2])
    # then the first chunk's rows are readable, the third's are ahead
    body, following, ahead = page(api, job)
    assert ids(body) == [f"r{i}" for i in range(50)]
    assert (following, ahead) == (50, 50)
    assert api.get(f"{JOBS}/{job.pk}/progress").json()["rows_readable_after"] == 50
    # and asking from the cursor, nothing new yet: an empty page, the same cursor
    assert page(api, job, 50) == (b"", 50, 50)
    # a limit cuts a page; the cursor says where
    first, following, ahead = page(api, job, 0, 20)
    assert (ids(first), following, ahead) == ([f"r{i}" for i in range(20)], 20, 80)
    assert first == body[:len(first)]

    # when the second finishes, the rows through the third are contiguous
    complete(chunks[1])
    second, following, ahead = page(api, job, 50, 60)
    assert (ids(second), following, ahead) == ([f"r{i}" for i in range(50, 110)], 110, 40)
    third, following, ahead = page(api, job, 110)
    assert (ids(third), following, ahead) == ([f"r{i}" for i in range(110, 150)], 150, 0)
    # a cursor past what is readable reads nothing
    assert page(api, job, 200) == (b"", 200, 0)
    running = body + second + third

    # then the job finishes: the result's first lines are the lines read, each with its
    # cost member put before its closing brace
    complete(chunks[3])
    complete(chunks[4])
    last, following, ahead = page(api, job, 150)
    assert (following, ahead) == (230, 0)
    running += last
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    final = result_bytes(job)
    assert_costed(running, final)
    # and once it has ended, its pages are the result file itself, byte for byte
    assert all_pages(api, job, 70) == final
    tail, following, ahead = page(api, job, 200, 7)
    assert (tail, following, ahead) == (b"".join(final.splitlines(keepends=True)[200:207]),
                                        207, 23)
    assert page(api, job, 230) == (b"", 230, 0)
    assert api.get(f"{JOBS}/{job.pk}/progress").json()["rows_readable_after"] == 230


@pytest.mark.django_db
def test_a_page_reads_a_bounded_number_of_chunks(
        api: APIClient, organization: Organization, sent: list[str],
        monkeypatch: pytest.MonkeyPatch, settings: Settings) -> None:
    settings.ANEX_CHUNK_ROWS = 10
    monkeypatch.setattr(pages, "PAGE_CHUNKS", 3)
    job = approved(organization, 100, est=10_000)
    job_start(job_id=job.pk)
    for chunk in job.chunks.all():
        complete(chunk)
    # a page of 1,000 asked reads 3 chunks (rows 5 to 29 of chunks 0 to 2), and its
    # cursor says where it ended
    body, following, ahead = page(api, job, 5)
    assert (ids(body), following, ahead) == ([f"r{i}" for i in range(5, 30)], 30, 70)
    body, following, ahead = page(api, job, 30)
    assert (ids(body), following, ahead) == ([f"r{i}" for i in range(30, 60)], 60, 40)


@pytest.mark.django_db
def test_a_cancelled_jobs_partial_result_begins_with_the_lines_read(
        api: APIClient, organization: Organization, sent: list[str]) -> None:
    job = approved(organization, 200, est=10_000)
    job_start(job_id=job.pk)
    chunks = list(job.chunks.order_by("index"))
    complete(chunks[0])
    complete(chunks[2])
    running, following, ahead = page(api, job)
    assert (following, ahead) == (50, 50)
    # cancelled with the second chunk still pending: it is skipped (as the ones after)
    assert job_cancel(job=Job.objects.get(pk=job.pk), actor=SYSTEM).status == \
        JobStatus.CANCELLING
    Chunk.objects.filter(job=job).exclude(status=ChunkStatus.DONE).update(
        status=ChunkStatus.SKIPPED)
    assert page(api, job, 50) == (b"", 50, 50)
    assert job_finalize(job_id=job.pk) == JobStatus.CANCELLED
    final = result_bytes(job)
    assert len(final.splitlines()) == 100  # the two finished chunks' rows
    assert_costed(running, b"".join(final.splitlines(keepends=True)[:50]))
    # once it has ended, every delivered line is read, the result's own bytes
    assert all_pages(api, job, 33) == final
    assert json.loads(page(api, job, 50, 1)[0])["custom_id"] == "r100"


@pytest.mark.django_db
def test_the_rows_are_scoped_as_the_result_is(
        api: APIClient, organization: Organization, sent: list[str],
        client_for: Any) -> None:
    job = approved(organization, 60, est=10_000)
    job_start(job_id=job.pk)
    complete(job.chunks.order_by("index").first())  # type: ignore[arg-type]
    assert page(api, job)[1] == 50
    # another organization's id is a 404, as an unknown one
    _key, theirs = api_key_make(organization_make())
    response = client_for(theirs).get(f"{JOBS}/{job.pk}/rows")
    assert response.status_code == 404
    assert response.json() == api.get(f"{JOBS}/00000000-0000-0000-0000-000000000000/rows").json()
    # a job whose data is kept in the EU is read from the EU API only
    eu = organization_make(eu_data_routing=True)
    _key, plaintext = api_key_make(eu)
    kept = job_make(eu, status=JobStatus.IN_PROGRESS)
    Job.objects.filter(pk=kept.pk).update(data_residency="eu")
    assert client_for(plaintext).get(f"{JOBS}/{kept.pk}/rows").status_code == 421
    # a bad query is 422, in the style of the result's ?merged
    for query, detail in ((("after", "-1"), "after must be a whole number, 0 or more."),
                          (("after", "x"), "after must be a whole number, 0 or more."),
                          (("limit", "0"), "limit must be a whole number from 1 to 10000."),
                          (("limit", "10001"), "limit must be a whole number from 1 to 10000."),
                          (("limit", "2.5"), "limit must be a whole number from 1 to 10000.")):
        response = api.get(f"{JOBS}/{job.pk}/rows", dict([query]))
        assert (response.status_code, response.json()["detail"]) == (422, detail)
    assert page(api, job, 0, 10000)[1] == 50
    # a client that asks for JSONL gets it; a refusal is still a JSON object
    asked = api.get(f"{JOBS}/{job.pk}/rows", HTTP_ACCEPT="application/jsonl")
    assert asked.status_code == 200 and asked["Content-Type"] == "application/jsonl"
    # data deleted: 410, as the result
    assert api.delete(f"{JOBS}/{job.pk}/data").status_code == 202
    job.refresh_from_db()
    Chunk.objects.filter(job=job).exclude(status=ChunkStatus.DONE).update(
        status=ChunkStatus.SKIPPED)
    job_finalize(job_id=job.pk)
    assert api.delete(f"{JOBS}/{job.pk}/data").status_code == 200  # stopped: purged now
    response = api.get(f"{JOBS}/{job.pk}/rows")
    assert response.status_code == 410
    assert response.json()["detail"] == api.get(f"{JOBS}/{job.pk}/result").json()["detail"]


@pytest.mark.django_db
def test_before_any_row_and_with_nothing_delivered_it_is_409(
        api: APIClient, organization: Organization) -> None:
    waiting = job_make(organization, status=JobStatus.COST_READY)
    response = api.get(f"{JOBS}/{waiting.pk}/rows")
    assert response.status_code == 409
    assert response.json()["detail"] == "This job is cost_ready: no row has finished yet."
    failed = job_make(organization, status=JobStatus.FAILED)
    response = api.get(f"{JOBS}/{failed.pk}/rows")
    assert response.status_code == 409
    assert response.json()["detail"] == api.get(f"{JOBS}/{failed.pk}/result").json()["detail"]


@pytest.mark.django_db
def test_a_parquet_jobs_rows_are_jsonl_envelopes_while_it_runs_and_after(
        api: APIClient, organization: Organization, sent: list[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    sink = io.BytesIO()
    pq.write_table(pa.table({"id": [f"r{i}" for i in range(120)],
                             "text": [f"text {i}" for i in range(120)]}), sink)
    job = approved(organization, 120, est=10_000, model="qwen3-embedding-8b",
                   content=sink.getvalue(), fmt="parquet")
    job_start(job_id=job.pk)
    chunks = list(job.chunks.order_by("index"))
    complete(chunks[1])
    assert page(api, job) == (b"", 0, 50)
    complete(chunks[0])
    running, following, ahead = page(api, job)
    assert (ids(running), following, ahead) == ([f"r{i}" for i in range(100)], 100, 0)
    assert all(list(json.loads(line)) == ["id", "custom_id", "response", "error"]
               for line in running.splitlines())
    complete(chunks[2])
    running += page(api, job, 100)[0]
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    # after the end, the same lines (the parquet file has its own cost column)
    assert all_pages(api, job, 45) == running


@pytest.mark.django_db(transaction=True)
def test_a_grouped_jobs_rows_are_read_in_file_order_as_its_chunks_finish(
        api: APIClient, organization: Organization, fake: None,  # noqa: F811
        settings: Settings, checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # given a grouped plan: 100 rows, 20 documents' questions interleaved in the file, run
    # in 7 chunks of 16 rows spread over it
    settings.ANEX_CHUNK_ROWS = grouped.CHUNK_ROWS
    settings.ANEX_GROUP_ROWS = True
    dispatch_catch(monkeypatch, lambda message: None, "job_estimate_task", "job_start_task",
                   "chunk_run_task", "job_finalize_task")
    content, _docs = grouped.documents_file(seed=44)
    job = grouped.submitted(api, organization, content)
    chunks = grouped.started(api, job)
    assert all(chunk.spans is not None for chunk in chunks)
    # when they run in their planned order, the rows are read as far as they are contiguous
    read, after, pending = b"", 0, list(chunks)
    while pending:
        ran = pending.pop(0)
        assert chunk_run(chunk_id=ran.pk) == ChunkStatus.DONE
        readable = min((row for chunk in pending for row in (chunk.spans or [])[0::3]),
                       default=100)
        finished = 100 - sum(chunk.row_count for chunk in pending)
        body, following, ahead = page(api, job, after)
        assert ids(body) == [f"r{i}" for i in range(after, readable)]
        assert (following, ahead) == (readable, finished - readable)
        read, after = read + body, following
    # with a page bounded to 2 chunks' results, a page is cut before a third chunk's row,
    # and its cursor says where
    monkeypatch.setattr(pages, "PAGE_CHUNKS", 2)
    owner = {row: chunk.index for chunk in chunks for row in (chunk.spans or [])[0::3]}
    body, following, _ahead = page(api, job, 0)
    third = next(row for row in range(100) if len({owner[r] for r in range(row + 1)}) == 3)
    assert ids(body) == [f"r{i}" for i in range(third)] and following == third
    monkeypatch.setattr(pages, "PAGE_CHUNKS", 64)
    # then, ended, the result is the lines read with their costs, and its pages are the file
    job_finalize(job_id=job.pk)
    final = result_bytes(job)
    assert_costed(read, final)
    assert all_pages(api, job, 30) == final


def test_the_docs_name_the_endpoint() -> None:
    root = Path(__file__).resolve().parents[2] / "docs"
    assert "/rows" in (root / "output-format.md").read_text()
    assert "anex tail" in (root / "cli.md").read_text()


@pytest.mark.django_db
def test_a_finished_jobs_page_reads_from_the_line_mark_before_it(
        api: APIClient, organization: Organization, sent: list[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    # given a finished 230-row job whose result marks every 16th line
    from jobs import results
    monkeypatch.setattr(results, "LINE_MARK_EVERY", 16)
    monkeypatch.setattr(pages, "LINE_MARK_EVERY", 16)
    job = approved(organization, 230, est=10_000)
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        complete(chunk)
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    final = result_bytes(job)
    lines = final.splitlines(keepends=True)
    # then each mark is where its line starts: lines 17, 33, ... (numbered from 1)
    starts = [sum(map(len, lines[:number - 1])) for number in range(17, 231, 16)]
    assert job.result_line_marks == starts
    # and a page read from its mark is the file's lines after its cursor, whatever the
    # cursor's place between marks; a page read with no marks (a job finished before
    # them) reads the same from the file's start
    for after in (0, 15, 16, 17, 31, 32, 100, 224, 229):
        expected = b"".join(lines[after:after + 9])
        assert page(api, job, after, 9)[0] == expected
        Job.objects.filter(pk=job.pk).update(result_line_marks=None)
        assert page(api, job, after, 9)[0] == expected
        Job.objects.filter(pk=job.pk).update(result_line_marks=starts)
    # and a mark that pointed elsewhere would show: the marks are what is read from
    Job.objects.filter(pk=job.pk).update(result_line_marks=[starts[1], *starts[1:]])
    assert page(api, job, 16, 1)[0] == lines[32]
