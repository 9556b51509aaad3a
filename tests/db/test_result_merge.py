"""The finalize merge reads chunk results ahead (RegionStorage.read_each) and from storage
once: its result file is byte for byte the one the sequential merge wrote (every chunk
opened in turn, read twice), JSONL and parquet, and it holds at most READ_AHEAD chunk
results at a time."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Generator, Iterator
from decimal import Decimal, localcontext
from typing import Any, cast

import pytest
from pytest_django import Settings

from billing.allocation import ALLOCATION_CONTEXT, ChargeAllocator, credits_text
from console.models import Organization
from inference.catalog import model_get
from inference.constants import RowOutcome
from inference.pricing import Usage
from jobs import results
from jobs.constants import JobStatus
from jobs.models import Chunk, Job
from jobs.services.lifecycle import job_approve
from jobs.services.running import job_finalize, job_start
from jobs.storage import RegionStorage, storage_for
from tests.chunks import chunk_done, row_record
from tests.db.test_storage import s3, s3_endpoint  # noqa: F401
from tests.factories import SYSTEM, chat_request_line, input_ready, job_make

pytestmark = pytest.mark.django_db

ROWS, CHUNK_ROWS = 1000, 64  # 16 chunks: more than READ_AHEAD


@pytest.fixture(autouse=True)
def credits(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = CHUNK_ROWS


def sequential_records_costed(job: Job, chunks: list[Chunk], *,
                              charge: int) -> Iterator[dict[str, Any]]:
    """The merge's rows as they were read before the read-ahead (the oracle): each chunk
    result opened in turn and iterated line by line, twice, one to weigh, one to hand out.
    Read exactly (the standard library's json: orjson reads an integer wider than 64 bits
    as a float), as the merge copies each row's answer as its chunk wrote it."""
    storage = storage_for(job.data_residency)

    def rows() -> Iterator[dict[str, Any]]:
        for chunk in chunks:
            with storage.open(results.chunk_key(job, chunk.index)) as handle:
                yield from (json.loads(line) for line in handle if line.strip())

    model = model_get(job.model)
    total, billed = Decimal(0), 0
    with localcontext(ALLOCATION_CONTEXT):
        for row in rows():
            total += results._row_weight(row, model)
            billed += row["outcome"] != RowOutcome.ERROR
    even = not total
    allocator = ChargeAllocator(charge=charge, total_weight=Decimal(billed) if even else total)
    for row in rows():
        weight = (Decimal(row["outcome"] != RowOutcome.ERROR) if even
                  else results._row_weight(row, model))
        yield {**row, "cost": credits_text(allocator.share(weight))}


def record(index: int) -> dict[str, Any]:
    """Rows of every outcome and usage; some answers non-ASCII, one body with an integer
    wider than 64 bits."""
    outcome = (RowOutcome.ERROR if index % 17 == 3 else RowOutcome.TRUNCATED if index % 23 == 5
               else RowOutcome.SUCCESS)
    row = row_record(index, f"r{index}", outcome,
                     Usage(input_tokens=900 + 37 * index, output_tokens=index % 301),
                     answer=f"réponse {index} ✓" if index % 7 else f"a{index}")
    if index == 777:
        row["body"]["seed"] = 2**70
    return row


def finished(organization: Organization, *, fmt: str) -> Job:
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        buffer = io.BytesIO()
        pq.write_table(pa.table({"id": [f"r{i}" for i in range(ROWS)],
                                 "prompt": ["hi"] * ROWS}), buffer)
        content = buffer.getvalue()
    else:
        content = b"".join(chat_request_line(f"r{i}") for i in range(ROWS))
    job = job_make(organization, est_cost_cents=50_000, model="gemma4-12b")
    Job.objects.filter(pk=job.pk).update(
        input=input_ready(organization, content, fmt=fmt), row_count=ROWS,
        max_output_tokens=400, format=fmt, task_type="chat")
    job = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        chunk_done(chunk, [record(i) for i in range(chunk.first_row,
                                                    chunk.first_row + chunk.row_count)])
    return job


def spied_reads(storage: RegionStorage, monkeypatch: pytest.MonkeyPatch,
                finished_count: Callable[[], int]) -> dict[str, int]:
    """The storage's own reads, counted as they start and end: `inflight` the most at once,
    `held` the most begun and not yet done with by the caller (finished_count())."""
    counts = {"started": 0, "running": 0, "inflight": 0, "held": 0}
    lock = threading.Lock()
    real = storage.whole_reader

    def reader() -> Callable[[str], bytes]:
        read = real()

        def counted(key: str) -> bytes:
            with lock:
                counts["started"] += 1
                counts["running"] += 1
                counts["inflight"] = max(counts["inflight"], counts["running"])
                counts["held"] = max(counts["held"], counts["started"] - finished_count())
            threading.Event().wait(0.005)  # a read that takes a while, as a GET does
            try:
                return read(key)
            finally:
                with lock:
                    counts["running"] -= 1
        return counted

    monkeypatch.setattr(storage, "whole_reader", reader)
    return counts


@pytest.fixture(params=["local", "s3"])
def backend(request: pytest.FixtureRequest) -> str:
    """The storage backend a test runs on: the local one (the default), or moto's S3."""
    if request.param == "s3":
        request.getfixturevalue("s3")
    return str(request.param)


@pytest.mark.parametrize(("fmt", "backend"), [("jsonl", "local"), ("parquet", "local"),
                                              ("jsonl", "s3")], indirect=["backend"])
def test_the_merged_file_is_byte_identical_to_the_sequential_merge(
        organization: Organization, sent: list[str], fmt: str, backend: str) -> None:
    job = finished(organization, fmt=fmt)
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    job.refresh_from_db()
    assert job.cost_cents and job.chunks.count() == 16 > results.READ_AHEAD
    storage = storage_for("world")
    key = f"results/{job.organization_id}/{job.pk}/oracle.{fmt}"
    chunks = list(job.chunks.order_by("index"))
    assert results.rows_write(job, sequential_records_costed(job, chunks,
                                                             charge=job.cost_cents), key) == ROWS
    merged = storage.whole_reader()(job.result_key)
    assert merged == storage.whole_reader()(key)
    if fmt == "jsonl":
        assert merged.count(b"\n") == ROWS and b'"seed":' in merged


def test_the_merge_holds_at_most_read_ahead_chunk_results(
        organization: Organization, sent: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(results, "READ_AHEAD", 3)
    job = finished(organization, fmt="jsonl")
    # A chunk result is done with once the merge's first pass has weighed its last row
    # (and kept it in its local file for the second).
    written = [0]
    real_lines = results._lines

    def lines(data: bytes) -> Iterator[bytes]:
        yield from real_lines(data)
        written[0] += 1

    monkeypatch.setattr(results, "_lines", lines)
    counts = spied_reads(storage_for("world"), monkeypatch, lambda: written[0])
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    assert counts["started"] == 16  # each chunk result read from storage once
    assert 2 <= counts["inflight"] and counts["held"] <= 3


@pytest.mark.parametrize("ahead", [1, 4])
def test_read_each_keeps_order_and_at_most_ahead_objects(
        monkeypatch: pytest.MonkeyPatch, ahead: int, backend: str) -> None:
    storage = storage_for("world")
    keys = [f"results/test/part-{index:03d}" for index in range(20)]
    for index, key in enumerate(keys):
        storage.write_stream(key, iter([f"object {index}\n".encode() * (index + 1)]),
                             max_bytes=10_000)
    done = [0]
    counts = spied_reads(storage, monkeypatch, lambda: done[0])
    seen = []
    for data in storage.read_each(keys, ahead=ahead):
        seen.append(data)
        threading.Event().wait(0.01)  # a slow caller: reads left unbounded would pile up
        done[0] += 1
    assert seen == [f"object {index}\n".encode() * (index + 1) for index in range(20)]
    assert counts["started"] == 20 and counts["held"] == ahead
    assert (2 <= counts["inflight"] <= ahead) if ahead > 1 else counts["inflight"] == 1


def test_read_each_stopped_early_leaves_no_read_running(monkeypatch: pytest.MonkeyPatch,
                                                        backend: str) -> None:
    storage = storage_for("world")
    keys = [f"results/test/early-{index}" for index in range(10)]
    for key in keys:
        storage.write_stream(key, iter([b"x\n"]), max_bytes=10)
    counts = spied_reads(storage, monkeypatch, lambda: 0)
    reading = cast(Generator[bytes, None, None], storage.read_each(keys, ahead=4))
    assert next(reading) == b"x\n"
    reading.close()
    assert counts["running"] == 0 and counts["started"] <= 4
