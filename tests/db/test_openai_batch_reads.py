"""Issue 40 M4: reading a finished OpenAI batch (GET /openai/v1/batches/{id}, and each batch
of a list) streamed the job's whole result file on its first view, to size the output and
error files, and summed every chunk's usage on every view, inside the request. Both are
recorded once, when the job finalizes (Job.usage, Job.result_output_bytes and
result_error_bytes), and a read takes them from there."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from inference.constants import RowOutcome
from inference.pricing import Usage
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.lifecycle import job_approve
from jobs.services.metering import job_usage_done
from jobs.services.rows import rows_read
from jobs.services.running import job_finalize, job_start
from jobs.storage import LocalRegionStorage
from openai_api.batches import result_part_lines
from openai_api.models import FilePart, FilePurpose, OpenAIBatch, OpenAIFile
from tests.chunks import chunk_done, row_record
from tests.factories import SYSTEM, input_ready, job_make

pytestmark = pytest.mark.django_db
EMBED = "qwen3-vl-embedding-8b"
FAILED = {1, 4}


@pytest.fixture(autouse=True)
def setup(settings: Settings, sent: list[str]) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = 2


def finished_batch(organization: Organization, rows: int = 7) -> OpenAIBatch:
    """An OpenAI batch whose job ran (rows FAILED refused) and finalized, as the workers
    leave it; each answered row billed media-row tokens, which the batch's usage counts."""
    content = b"".join(json.dumps({
        "custom_id": f"r{i}", "method": "POST", "url": "/v1/embeddings",
        "body": {"model": EMBED, "input": f"text {i}"}}).encode() + b"\n" for i in range(rows))
    item = input_ready(organization, content)
    job = job_make(organization, est_cost_cents=1000, model=EMBED)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, approve_at_estimate=True,
                                          collect_row_errors=True, row_model=True)
    job = job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    job_start(job_id=job.pk)
    for chunk in job.chunks.order_by("index"):
        chunk_done(chunk, [row_record(
            row.index, row.ident,
            RowOutcome.ERROR if row.index in FAILED else RowOutcome.SUCCESS,
            Usage(input_tokens=3, media_row_tokens=7), embedding=[0.5, 0.25])
            for row in rows_read(job, chunk)])
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    file = OpenAIFile.objects.create(organization=organization, purpose=FilePurpose.BATCH,
                                     filename="in.jsonl", input=item,
                                     bytes=item.size_bytes or 0)
    return OpenAIBatch.objects.create(organization=organization,
                                      job=Job.objects.get(pk=job.pk), input_file=file,
                                      endpoint="/v1/embeddings")


def test_a_finished_batch_is_read_without_its_result_file_or_its_chunks(
        api: APIClient, organization: Organization, monkeypatch: pytest.MonkeyPatch) -> None:
    batch = finished_batch(organization)
    job = batch.job
    assert job is not None
    # what the old read computed in the request: every chunk's usage, every line's size
    expected = job_usage_done(job.pk)
    sizes = {part: sum(len(line) for line in result_part_lines(job, part))
             for part in FilePart}
    reads: list[str] = []
    for name in ("open", "whole_reader", "read_range", "read_head", "exists"):
        real = getattr(LocalRegionStorage, name)

        def spied(self: Any, *args: Any, __real: Any = real, __name: str = name,
                  **kwargs: Any) -> Any:
            reads.append(__name)
            return __real(self, *args, **kwargs)

        monkeypatch.setattr(LocalRegionStorage, name, spied)
    # when the batch is read (its first view, which makes its files) and listed, twice
    with CaptureQueriesContext(connection) as queries:
        bodies = [api.get(f"/openai/v1/batches/{batch.id}").json(),
                  api.get("/openai/v1/batches").json()["data"][0],
                  api.get(f"/openai/v1/batches/{batch.id}").json()]
    # then no storage was read and no chunk was summed
    assert reads == []
    assert not [q["sql"] for q in queries.captured_queries if '"jobs_chunk"' in q["sql"]]
    # and the batch says what the chunks and the file say
    assert bodies[0] == bodies[1] == bodies[2]
    usage = bodies[0]["usage"]
    input_tokens = expected.input_tokens + expected.media_row_tokens
    assert expected.media_row_tokens == 7 * 5 and usage["input_tokens"] == input_tokens
    assert usage["total_tokens"] == input_tokens + expected.output_tokens
    output = OpenAIFile.objects.get(pk=bodies[0]["output_file_id"])
    error = OpenAIFile.objects.get(pk=bodies[0]["error_file_id"])
    assert (output.bytes, error.bytes) == (sizes[FilePart.OUTPUT], sizes[FilePart.ERROR])
    assert output.bytes > 0 and error.bytes > 0
