"""Parquet inputs (docs/decisions.md, "Inputs and results"): chat rows from a `prompt` column
(text) or a `messages` column (JSON text, or a native list of message structs), embedding
rows from an `input` column; an `id` column is the row identity, else the row's row_index.

Read a record batch at a time, only the columns the checks need, so a large file is never
held whole in memory. Parquet rows carry no per-row thinking, effort, response_format or
dimensions (output-format.txt): the job's settings apply to every row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from jobs.validation.chat import chat_cost, job_thinking
from jobs.validation.core import (
    ENDPOINT_BY_TASK,
    CountTokens,
    FileReport,
    InputRejected,
    JobContext,
    JobOptions,
    ProbeContentType,
    RowCost,
    RowRef,
    Tally,
)
from jobs.validation.embeddings import embedding_input
from jobs.validation.ids import DigestSet

if TYPE_CHECKING:
    import pyarrow.parquet as pq

BATCH_ROWS = 4096
ID, PROMPT, MESSAGES, INPUT = "id", "prompt", "messages", "input"


def validate_parquet(source: str | Path | IO[bytes], options: JobOptions, *,
                     count_tokens: CountTokens,
                     probe_content_type: ProbeContentType | None = None) -> FileReport:
    """The parquet twin of validate_jsonl: same rules, same report, same rejections."""
    # Imported here: a JSONL job (nearly all of them) need not load pyarrow at all.
    import pyarrow.parquet as pq

    job = JobContext(options, count_tokens, probe_content_type)
    model = job.model
    if model.task == "decide":
        raise InputRejected(f"Model '{model.id}' takes JSONL input only: a decision job's "
                            "rows are JSONL lines with state and questions.")
    try:
        parquet = pq.ParquetFile(source)
    except Exception as error:  # pyarrow raises its own ArrowInvalid/OSError family
        raise InputRejected(f"The input is not a readable parquet file ({error}).") from None
    content, identity = parquet_columns(parquet, model.task)
    tally = Tally(ENDPOINT_BY_TASK[model.task])
    ids = DigestSet()
    thinking, effort = job_thinking(job)
    for row_index, name, value in parquet_rows(parquet, content, identity):
        row = _row_ref(row_index, name, identity, ids)
        if model.task == "chat":
            cost = _chat(content, value, job=job, row=row)
            cost.thinking, cost.effort = thinking, effort
        else:
            cost = embedding_input(value, job=job, row=row)
        tally.add(cost)
    return tally.report(job)


def parquet_columns(parquet: pq.ParquetFile, task: str) -> tuple[str, str | None]:
    """The column a row's content comes from, and the identity column if there is one."""
    columns = set(parquet.schema_arrow.names)
    if task == "chat":
        content = MESSAGES if MESSAGES in columns else PROMPT if PROMPT in columns else None
        if content is None:
            raise InputRejected("A parquet input for a chat model needs a 'prompt' column "
                                "(text) or a 'messages' column (JSON text).")
    else:
        if INPUT not in columns:
            raise InputRejected("A parquet input for an embedding model needs an 'input' "
                                "column.")
        content = INPUT
    return content, ID if ID in columns else None


def parquet_rows(parquet: pq.ParquetFile, content: str, identity: str | None, *,
                 start: int = 0) -> Iterator[tuple[int, Any, Any]]:
    """(row_index, id, content) from `start` on, a record batch at a time; whole row
    groups before `start` are skipped without being read."""
    wanted = [content] if identity is None else [identity, content]
    row_index = 0
    groups: list[int] = []
    for group in range(parquet.metadata.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        if row_index + rows <= start and not groups:
            row_index += rows
            continue
        groups.append(group)
    if not groups:
        return
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted,
                                      row_groups=groups):
        values = batch.column(content).to_pylist()
        names = batch.column(identity).to_pylist() if identity else [None] * len(values)
        for name, value in zip(names, values, strict=True):
            if row_index >= start:
                yield row_index, name, value
            row_index += 1


def _row_ref(row_index: int, name: Any, identity: str | None, ids: DigestSet) -> RowRef:
    if identity is None:
        return RowRef.index(row_index)  # row_index is unique by construction
    if name is None or name == "":
        raise RowRef.index(row_index).reject("id is empty; an id column names every row")
    row = RowRef.named(str(name))
    if not ids.add(str(name)):
        raise row.reject("id is used by an earlier row; every row needs its own id")
    return row


def _chat(column: str, value: Any, *, job: JobContext, row: RowRef) -> RowCost:
    if column == PROMPT:
        if not isinstance(value, str) or not value:
            raise row.reject("prompt is empty")
        return chat_cost([{"role": "user", "content": value}], job=job, row=row)
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError):
            raise row.reject("messages is not valid JSON: it must be a JSON list of "
                             "messages") from None
    return chat_cost(value, job=job, row=row)
