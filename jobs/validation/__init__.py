"""The input checker: every row of a job's input, checked against the model and the job
before anything is billed, and counted so the job can be priced.

A pure library: no database, no network of its own. The caller injects the model's
tokenizer (`count_tokens`) and, optionally, the product's SSRF-safe HEAD probe
(`probe_content_type`, anex/net.py in production).

    report = validate_jsonl(stream, JobOptions(model="qwen3.8-27b"),
                            count_tokens=tokenizer_count)
    price(model, report.usage)

A violation raises RowRejected (an InputRejected) whose `message` is the job's
failure_reason; the job fails with failure_code invalid_input and is never billed. Given
`errors=RowErrors(limit)` (a preflight check), the checker instead records each failing
row with that same message and reads on, reporting the rows that passed.
"""

from inference.rows.core import (
    CHAT,
    DECISIONS,
    EMBEDDINGS,
    PROBE_LIMIT,
    CountTokens,
    FileReport,
    InputRejected,
    JobOptions,
    ProbeContentType,
    RowRejected,
)
from jobs.validation.core import RowError, RowErrors
from jobs.validation.lines import validate_jsonl
from jobs.validation.parquet import validate_parquet

__all__ = [
    "CHAT",
    "DECISIONS",
    "EMBEDDINGS",
    "PROBE_LIMIT",
    "CountTokens",
    "FileReport",
    "InputRejected",
    "JobOptions",
    "ProbeContentType",
    "RowError",
    "RowErrors",
    "RowRejected",
    "validate_jsonl",
    "validate_parquet",
]
