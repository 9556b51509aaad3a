"""A chunk's rows: read from the input, turned into engine requests, and each outcome
turned into the record the chunk's results object keeps (one JSON line per row).

The job's model and output cap always win over a row's; a row's own thinking setting,
effort level and response_format win over the job's (output-format.txt).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jobs.constants import InputFormat, RowOutcome
from jobs.models import Chunk, Job
from jobs.storage import LocalRegionStorage, storage_for
from jobs.validation.parquet import MESSAGES, PROMPT, parquet_columns, parquet_rows

# Downloaded parquet inputs, per worker process (an S3 object is fetched once, not per chunk).
_PARQUET_CACHE = Path(tempfile.gettempdir()) / "anex-parquet-inputs"


@dataclass(frozen=True)
class InputRow:
    index: int
    ident: str  # custom_id (JSONL), the id column, or the row_index (parquet)
    body: dict[str, Any]  # the request body: messages/chat_template_kwargs/…, input, state…


def input_parquet_path(job: Job) -> Path:
    assert job.input is not None
    storage = storage_for(job.data_residency)
    if isinstance(storage, LocalRegionStorage):
        return storage.path(job.input.object_key)
    name = hashlib.sha256(job.input.object_key.encode()).hexdigest() + ".parquet"
    path = _PARQUET_CACHE / name
    if not path.exists():
        _PARQUET_CACHE.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        with storage.open(job.input.object_key) as source, partial.open("wb") as target:
            shutil.copyfileobj(source, target, 1024 * 1024)
        partial.replace(path)
    return path


def rows_read(job: Job, chunk: Chunk) -> list[InputRow]:
    """The chunk's rows, in input order (the file was validated while estimating)."""
    assert job.input is not None
    if job.format == InputFormat.JSONL:
        assert chunk.byte_start is not None and chunk.byte_end is not None
        data = storage_for(job.data_residency).read_range(job.input.object_key,
                                                         chunk.byte_start, chunk.byte_end)
        lines = [line for line in data.splitlines() if line.strip()]
        rows = []
        for offset, line in enumerate(lines):
            request = json.loads(line)
            rows.append(InputRow(chunk.first_row + offset, str(request["custom_id"]),
                                 request.get("body") or {}))
        return rows
    import pyarrow.parquet as pq

    parquet = pq.ParquetFile(input_parquet_path(job))
    content, identity = parquet_columns(parquet, job.task_type)
    rows = []
    for row_index, name, value in parquet_rows(parquet, content, identity,
                                               start=chunk.first_row):
        if row_index >= chunk.first_row + chunk.row_count:
            break
        if content == PROMPT:
            body: dict[str, Any] = {"messages": [{"role": "user", "content": value}]}
        elif content == MESSAGES:
            body = {"messages": json.loads(value) if isinstance(value, str) else value}
        else:
            body = {"input": value}
        rows.append(InputRow(row_index, str(name if identity else row_index), body))
    return rows


def chat_kwargs(job: Job, body: dict[str, Any]) -> dict[str, Any]:
    """The row's chat_template_kwargs, the job's thinking setting and effort filling in
    only what the row leaves unsaid."""
    kwargs = dict(body.get("chat_template_kwargs") or {})
    if "enable_thinking" not in kwargs and job.reasoning is not None:
        kwargs["enable_thinking"] = job.reasoning
    if "reasoning_effort" not in kwargs and job.reasoning_effort:
        kwargs["reasoning_effort"] = job.reasoning_effort
    return kwargs


def row_response_format(job: Job, body: dict[str, Any]) -> dict[str, Any] | None:
    """A row's own response_format replaces the job's whole (all or nothing)."""
    own = body.get("response_format")
    return own if own is not None else job.response_format


def record(row: InputRow, outcome: RowOutcome, *, body: dict[str, Any] | None = None,
           error: dict[str, Any] | None = None, status_code: int | None = None,
           output: str | None = None, embedding: list[float] | None = None) -> dict[str, Any]:
    """One row's result as the chunk object keeps it; the result file is made from these."""
    return {"i": row.index, "id": row.ident, "outcome": outcome.value, "status_code": status_code,
            "body": body, "error": error, "output": output, "embedding": embedding}


def completion_body(job: Job, row: InputRow, *, content: str | None, reasoning: str | None,
                    finish_reason: str, prompt_tokens: int, completion_tokens: int,
                    reasoning_tokens: int) -> dict[str, Any]:
    """The chat completion object, as an OpenAI-compatible server returns it."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning  # the trace, never mixed into content
    return {
        "id": f"chatcmpl-{job.pk.hex[:12]}-{row.index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": job.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}},
    }


def embedding_body(job: Job, vector: list[float], prompt_tokens: int) -> dict[str, Any]:
    return {"object": "list", "model": job.model,
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}
