"""The result file: chunk results merged in input order into the input's format
(output-format.txt). JSONL rows get the OpenAI batch output envelope; parquet rows keep the
input's columns plus id/row_index, output (or embedding) and error_type."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from typing import Any

from jobs.constants import InputFormat, RowOutcome, TaskType
from jobs.models import Chunk, Job
from jobs.storage import storage_for

# The parquet error_type of a row that stopped on the output-token cap.
TRUNCATED_MARKER = "length"


def chunk_key(job: Job, index: int) -> str:
    return f"results/{job.organization_id}/{job.pk}/chunks/{index:06d}.jsonl"


def result_key(job: Job) -> str:
    return f"results/{job.organization_id}/{job.pk}/result.{job.format}"


def records(job: Job, chunks: list[Chunk]) -> Iterator[dict[str, Any]]:
    """Every delivered row's record, in input order (chunks are in index order)."""
    storage = storage_for(job.data_residency)
    for chunk in chunks:
        with storage.open(chunk_key(job, chunk.index)) as handle:
            for line in handle:
                if line.strip():
                    yield json.loads(line)


def envelope(row: dict[str, Any]) -> dict[str, Any]:
    ident = row["id"]
    produced = row["outcome"] != RowOutcome.ERROR
    return {
        "id": f"batch_req_{ident}",
        "custom_id": ident,
        "response": {"status_code": row["status_code"], "request_id": f"req_{ident}",
                     "body": row["body"] if produced else None},
        "error": row["error"],
    }


def _error_type(row: dict[str, Any]) -> str | None:
    if row["outcome"] == RowOutcome.TRUNCATED:
        return TRUNCATED_MARKER
    return (row["error"] or {}).get("type") if row["outcome"] != RowOutcome.SUCCESS else None


def result_write(job: Job, chunks: list[Chunk]) -> tuple[str, int]:
    """Write the result object; returns its key and how many rows it holds."""
    storage = storage_for(job.data_residency)
    key = result_key(job)
    if job.format == InputFormat.JSONL:
        count = [0]

        def lines() -> Iterator[bytes]:
            for row in records(job, chunks):
                count[0] += 1
                yield json.dumps(envelope(row), separators=(",", ":")).encode() + b"\n"

        storage.write_stream(key, lines(), max_bytes=2**62)
        return key, count[0]
    return key, _parquet_write(job, chunks, key)


def _parquet_write(job: Job, chunks: list[Chunk], key: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.services.rows import input_parquet_path

    source = pq.ParquetFile(input_parquet_path(job))
    has_id = "id" in source.schema_arrow.names
    embed = job.task_type == TaskType.EMBED
    results = records(job, chunks)
    pending = next(results, None)
    written = 0
    with tempfile.NamedTemporaryFile(suffix=".parquet") as local:
        writer: pq.ParquetWriter | None = None
        row_index = 0
        for batch in source.iter_batches(batch_size=4096):
            take, outputs, error_types = [], [], []
            for offset in range(batch.num_rows):
                if pending is not None and pending["i"] == row_index:
                    take.append(offset)
                    outputs.append(pending["embedding"] if embed else pending["output"])
                    error_types.append(_error_type(pending))
                    pending = next(results, None)
                row_index += 1
            if not take:
                continue
            table = pa.Table.from_batches([batch]).take(take)
            if not has_id:
                table = table.append_column("row_index", pa.array(
                    [row_index - batch.num_rows + i for i in take], pa.int64()))
            if embed:
                table = table.append_column("embedding", pa.array(
                    outputs, pa.list_(pa.float32())))
            else:
                table = table.append_column("output", pa.array(outputs, pa.string()))
            table = table.append_column("error_type", pa.array(error_types, pa.string()))
            if writer is None:
                writer = pq.ParquetWriter(local.name, table.schema)
            writer.write_table(table)
            written += len(take)
        if writer is not None:
            writer.close()
        else:  # nothing delivered: an empty file with the result's columns
            empty = pa.table({"row_index": pa.array([], pa.int64())})
            pq.write_table(empty, local.name)
        local.seek(0)
        storage_for(job.data_residency).write_stream(
            key, iter(lambda: local.read(1024 * 1024), b""), max_bytes=2**62)
    return written
