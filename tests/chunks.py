"""A chunk finished as jobs.services.running.chunk_run finishes it, for the tests that drive
a job's run without an engine: its records written where jobs.results reads them, then the
chunk recorded done with its row counts by outcome and its rows' usage summed."""

from __future__ import annotations

from collections import Counter
from typing import Any

from django.utils import timezone

from inference.constants import RowOutcome
from inference.kinds.embed import embeddings_body
from inference.pricing import Usage, usage_from_json, usage_json
from jobs.constants import ChunkStatus
from jobs.jsonl import line_dumps
from jobs.models import Chunk, Job
from jobs.results import chunk_key
from jobs.storage import storage_for


def row_record(index: int, ident: str, outcome: RowOutcome, usage: Usage, *,
               answer: str | None = None,
               embedding: list[float] | None = None) -> dict[str, Any]:
    """One row's record as a chunk's file holds it: a chat answer (`answer`), a vector
    (`embedding`), or, for RowOutcome.ERROR, a row error that billed nothing."""
    if outcome == RowOutcome.ERROR:
        return {"i": index, "id": ident, "outcome": outcome.value, "status_code": 400,
                "body": None, "output": None,
                "error": {"message": "failed", "type": "server_error", "code": None,
                          "param": None},
                "usage": usage_json(Usage())}
    body = ({"choices": [{"message": {"content": answer}}]} if answer is not None else
            embeddings_body("test", [embedding], usage.input_tokens) if embedding is not None
            else {})
    return {"i": index, "id": ident, "outcome": outcome.value, "status_code": 200,
            "body": body, "output": answer, "error": None, "usage": usage_json(usage)}


def chunk_done(chunk: Chunk, records: list[dict[str, Any]]) -> None:
    """Write the chunk's records and record it done, as chunk_run does."""
    job = Job.objects.get(pk=chunk.job_id)
    lines = [line_dumps(record) for record in records]
    storage_for(job.data_residency).write_stream(chunk_key(job, chunk.index), iter(lines),
                                                 max_bytes=10**8)
    counts = Counter(RowOutcome(record["outcome"]) for record in records)
    total = sum((usage_from_json(record["usage"]) for record in records), Usage())
    Chunk.objects.filter(pk=chunk.pk).update(
        status=ChunkStatus.DONE, finished_at=timezone.now(), usage=usage_json(total),
        success_rows=counts[RowOutcome.SUCCESS], error_rows=counts[RowOutcome.ERROR],
        truncated_rows=counts[RowOutcome.TRUNCATED],
        format_error_rows=counts[RowOutcome.FORMAT_ERROR])
