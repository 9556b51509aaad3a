"""JSONL framing and the request envelope: one OpenAI-batch request object per line, all of
them for the one endpoint the job's model serves.

The file is read one line at a time and each row is dropped once checked; what is kept
across rows is a handful of running sums and the 8-byte digest of every custom_id, so a
million-row file validates in bounded memory. The first violation stops the read.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import BinaryIO

from jobs.validation.chat import chat_row
from jobs.validation.core import (
    ENDPOINT_BY_TASK,
    ENDPOINTS,
    CountTokens,
    FileReport,
    JobContext,
    JobOptions,
    ProbeContentType,
    RowCost,
    RowRef,
    RowRejected,
    Tally,
    TextTooLong,
    listing,
    thousands,
)
from jobs.validation.decisions import decision_row
from jobs.validation.embeddings import embedding_row
from jobs.validation.ids import DigestSet

RowCheck = Callable[..., RowCost]
ROW_CHECKS: dict[str, RowCheck] = {"chat": chat_row, "embed": embedding_row,
                                   "decide": decision_row}
_BOM = b"\xef\xbb\xbf"
_TASK_NAMES = {"chat": "a chat model", "embed": "an embedding model",
               "decide": "a decision model"}
_READ_BYTES = 1024 * 1024


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# One decoder for the whole read (json.loads builds a new one per call); NaN and Infinity,
# which Python's json accepts, are not JSON and would not survive the row's serving.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def validate_jsonl(stream: BinaryIO, options: JobOptions, *, count_tokens: CountTokens,
                   probe_content_type: ProbeContentType | None = None) -> FileReport:
    """Check every line of a JSONL input against the job, and count what it consumes.

    Raises RowRejected (naming the row or line) at the first violation, InputRejected for a
    file with no rows. `count_tokens` is the model's tokenizer; `probe_content_type` answers
    a HEAD request's Content-Type (None when the host did not answer)."""
    job = JobContext(options, count_tokens, probe_content_type)
    task = job.model.task
    endpoint = ENDPOINT_BY_TASK[task]
    check = ROW_CHECKS[task]
    tally = Tally(endpoint)
    ids = DigestSet()
    blank_since: int | None = None
    for number, raw in enumerate(lines_bounded(stream, job.line_max_bytes), start=1):
        line = raw.strip()
        if number == 1 and line.startswith(_BOM):
            line = line[len(_BOM):].strip()
        if not line:
            blank_since = blank_since or number
            continue
        if blank_since is not None:
            raise RowRef.line(blank_since).reject(
                "the line is blank; a JSONL input has one request per line and no blank "
                "lines between them"
            )
        row, body = _envelope(line, number, ids=ids, job=job, first=tally.rows == 0)
        try:
            tally.add(check(body, job=job, row=row))
        except TextTooLong as too_long:
            raise too_long.reject(row, job.model) from None
    return tally.report(job)


def lines_bounded(stream: BinaryIO, max_bytes: int) -> Iterator[bytes]:
    """The stream's lines, read a block at a time (any object with read(): a local file or
    an S3 body alike); a line longer than max_bytes is refused as soon as that many bytes
    of it are read, so memory stays bounded by the cap whatever the file holds."""
    limit = max_bytes + 1  # a \r before the newline does not count against the cap
    number, size = 1, 0
    parts: list[bytes] = []
    while block := stream.read(_READ_BYTES):
        pieces = block.split(b"\n")
        for piece in pieces[:-1]:
            if size + len(piece) > limit:
                raise _line_too_long(number, max_bytes)
            # Blocks of one long line are kept as a list and joined once: no quadratic copy.
            yield b"".join([*parts, piece]) if parts else piece
            parts, size, number = [], 0, number + 1
        if pieces[-1]:
            parts.append(pieces[-1])
            size += len(pieces[-1])
            if size > limit:
                raise _line_too_long(number, max_bytes)
    if parts:
        yield b"".join(parts)


def _line_too_long(number: int, max_bytes: int) -> RowRejected:
    return RowRef.line(number).reject(
        f"the line is longer than {thousands(max_bytes)} bytes, the most one request line "
        "may take; shorten or split this request")


def _envelope(line: bytes, number: int, *, ids: DigestSet, job: JobContext,
              first: bool) -> tuple[RowRef, dict[str, object]]:
    """The request object around the body: custom_id, method, url, body."""
    where = RowRef.line(number)
    try:
        request = _DECODER.decode(line.decode("utf-8"))
    except ValueError as error:  # JSONDecodeError, and UnicodeDecodeError for non-UTF-8
        detail = f" ({error.msg} at column {error.colno})" \
            if isinstance(error, json.JSONDecodeError) else ""
        raise where.reject(f"not valid JSON{detail}; each line must be one request "
                           "object") from None
    except RecursionError:  # thousands of nested brackets: refused, never a crash
        raise where.reject("not valid JSON (nested too deeply); each line must be one "
                           "request object") from None
    if not isinstance(request, dict):
        raise where.reject("not a JSON object; each line must be one request object with "
                           "custom_id, method, url and body")
    custom_id = request.get("custom_id")
    if custom_id is None:
        raise where.reject("custom_id is missing; every line needs a custom_id string")
    if not isinstance(custom_id, str) or not custom_id:
        raise where.reject(f"custom_id must be a non-empty string, not {custom_id!r}")
    row = RowRef.named(custom_id)
    if not ids.add(custom_id):
        raise row.reject("custom_id is used by an earlier line; every row needs its own "
                         "custom_id")
    if request.get("method") != "POST":
        raise row.reject(f"method must be \"POST\", not {request.get('method')!r}")
    url = request.get("url")
    model = job.model
    expected = ENDPOINT_BY_TASK[model.task]
    if url not in ENDPOINTS:
        raise row.reject(f"url {url!r} is not an endpoint a batch job takes: "
                         f"{listing(list(ENDPOINTS), 'or')}")
    if url != expected:
        if first:
            raise row.reject(f"url '{url}' does not match model '{model.id}': "
                             f"{_TASK_NAMES[model.task]} takes {expected} rows")
        raise row.reject(f"url '{url}' mixes endpoints: this file's rows target {expected}, "
                         "and a file's rows must all target the same endpoint")
    body = request.get("body")
    if not isinstance(body, dict):
        raise row.reject("body must be a JSON object")
    return row, body
