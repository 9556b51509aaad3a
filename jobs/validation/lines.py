"""JSONL framing and the request envelope: one OpenAI-batch request object per line, all of
them for the one endpoint the job's model serves.

The file is read one line at a time and each row is dropped once checked; what is kept
across rows is a handful of running sums and the 8-byte digest of every custom_id, so a
million-row file validates in bounded memory. The first violation stops the read (in
collect mode, a preflight check's, every violation is recorded and the read goes on).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import BinaryIO

import orjson

from jobs.validation.core import (
    ENDPOINTS,
    CountBatch,
    CountTokens,
    FileReport,
    JobContext,
    JobOptions,
    ProbeContentType,
    RowError,
    RowErrors,
    RowRef,
    RowRejected,
    Tally,
    TextTooLong,
    listing,
    thousands,
)
from jobs.validation.ids import DigestSet

_BOM = b"\xef\xbb\xbf"
_READ_BYTES = 1024 * 1024


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# One decoder for the whole read (json.loads builds a new one per call); NaN and Infinity,
# which Python's json accepts, are not JSON and would not survive the row's serving.
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def _loads(line: bytes) -> object:
    """orjson, and where it refuses a line, the standard decoder, whose answer (a value
    orjson will not take, such as an integer wider than 64 bits) or message is the one
    the checker has always given."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return _DECODER.decode(line.decode("utf-8"))


def validate_jsonl(stream: BinaryIO, options: JobOptions, *, count_tokens: CountTokens,
                   probe_content_type: ProbeContentType | None = None,
                   errors: RowErrors | None = None) -> FileReport:
    """Check every line of a JSONL input against the job, and count what it consumes.

    Raises RowRejected (naming the row or line) at the first violation, InputRejected for a
    file with no rows. `count_tokens` is the model's tokenizer; `probe_content_type` answers
    a HEAD request's Content-Type (None when the host did not answer). With `errors` (a
    preflight check), each violation is recorded there instead and the read goes on: the
    report then counts the rows that passed."""
    job = JobContext(options, count_tokens, probe_content_type)
    job.deferring = True  # text-only rows are counted COUNT_BATCH_ROWS at a time
    kind = job.kind
    tally = Tally(kind.endpoint)
    batch = CountBatch(job, tally)

    def recorded(rejected: RowRejected, where: object) -> None:
        assert errors is not None and isinstance(where, tuple)
        number, line = where
        errors.add(RowError(rejected.message, line=number, custom_id=_custom_id(line)))

    on_reject = None if errors is None else recorded
    ids = DigestSet()
    blank_since: int | None = None
    lines = lines_bounded(stream, job.line_max_bytes, skip_long=errors is not None)
    for number, raw in enumerate(lines, start=1):
        if raw is None:  # collect mode: an over-long line, skipped unread
            assert errors is not None
            batch.flush(on_reject)  # the rows before it are reported first
            errors.add(RowError(_line_too_long(number, job.line_max_bytes).message,
                                line=number))
            continue
        line = raw.strip()
        if number == 1 and line.startswith(_BOM):
            line = line[len(_BOM):].strip()
        if not line:
            blank_since = blank_since or number
            continue
        if blank_since is not None:
            batch.flush(on_reject)
            blank = RowRef.line(blank_since).reject(
                "the line is blank; a JSONL input has one request per line and no blank "
                "lines between them"
            )
            if errors is None:
                raise blank
            errors.add(RowError(blank.message, line=blank_since), row=False)
            blank_since = None
        try:
            row, body = _envelope(line, number, ids=ids, job=job,
                                  first=tally.rows == 0 and not batch.pending)
            try:
                batch.add(row, kind.row_cost(body, job=job, row=row), (number, line))
            except TextTooLong as too_long:
                raise too_long.reject(row, job.model) from None
        except RowRejected as rejected:
            batch.flush(on_reject)  # an earlier row's failure comes first
            if errors is None:
                raise
            errors.add(RowError(rejected.message, line=number, custom_id=_custom_id(line)))
    batch.flush(on_reject)
    return tally.report(job, errors=errors)


def _custom_id(line: bytes) -> str | None:
    """A failing line's custom_id, when it has a readable one (collect mode only)."""
    try:
        request = _DECODER.decode(line.decode("utf-8"))
    except (ValueError, RecursionError):
        return None
    value = request.get("custom_id") if isinstance(request, dict) else None
    return value if isinstance(value, str) and value else None


def lines_bounded(stream: BinaryIO, max_bytes: int, *,
                  skip_long: bool = False) -> Iterator[bytes | None]:
    """The stream's lines, read a block at a time (any object with read(): a local file or
    an S3 body alike); a line longer than max_bytes is refused as soon as that many bytes
    of it are read, so memory stays bounded by the cap whatever the file holds. With
    skip_long, such a line is read past instead and stands as None (collect mode)."""
    limit = max_bytes + 1  # a \r before the newline does not count against the cap
    number, size = 1, 0
    parts: list[bytes] = []
    skipping = False
    while block := stream.read(_READ_BYTES):
        pieces = block.split(b"\n")
        for piece in pieces[:-1]:
            if skipping or size + len(piece) > limit:
                if not skip_long:
                    raise _line_too_long(number, max_bytes)
                yield None
            else:
                # Blocks of one long line are kept as a list and joined once: no quadratic
                # copy.
                yield b"".join([*parts, piece]) if parts else piece
            parts, size, number, skipping = [], 0, number + 1, False
        if pieces[-1] and not skipping:
            parts.append(pieces[-1])
            size += len(pieces[-1])
            if size > limit:
                if not skip_long:
                    raise _line_too_long(number, max_bytes)
                parts, size, skipping = [], 0, True
    if skipping:
        yield None
    elif parts:
        yield b"".join(parts)


def _line_too_long(number: int, max_bytes: int) -> RowRejected:
    return RowRef.line(number).reject(
        f"the line is longer than {thousands(max_bytes)} bytes, the most one request line "
        "may take; shorten or split this request")


def _at(number: int) -> RowRef:
    # Made only when a line fails: most lines never need their reference.
    return RowRef.line(number)


def _envelope(line: bytes, number: int, *, ids: DigestSet, job: JobContext,
              first: bool) -> tuple[RowRef, dict[str, object]]:
    """The request object around the body: custom_id, method, url, body."""
    try:
        request = _loads(line)
    except ValueError as error:  # JSONDecodeError, and UnicodeDecodeError for non-UTF-8
        detail = f" ({error.msg} at column {error.colno})" \
            if isinstance(error, json.JSONDecodeError) else ""
        raise _at(number).reject(f"not valid JSON{detail}; each line must be one request "
                           "object") from None
    except RecursionError:  # thousands of nested brackets: refused, never a crash
        raise _at(number).reject("not valid JSON (nested too deeply); each line must be one "
                           "request object") from None
    if not isinstance(request, dict):
        raise _at(number).reject("not a JSON object; each line must be one request object with "
                           "custom_id, method, url and body")
    custom_id = request.get("custom_id")
    if custom_id is None:
        raise _at(number).reject("custom_id is missing; every line needs a custom_id string")
    if not isinstance(custom_id, str) or not custom_id:
        raise _at(number).reject(f"custom_id must be a non-empty string, not {custom_id!r}")
    row = RowRef.named(custom_id)
    if not ids.add(custom_id):
        raise row.reject("custom_id is used by an earlier line; every row needs its own "
                         "custom_id")
    if request.get("method") != "POST":
        raise row.reject(f"method must be \"POST\", not {request.get('method')!r}")
    url = request.get("url")
    model = job.model
    expected = job.kind.endpoint
    if url not in ENDPOINTS:
        raise row.reject(f"url {url!r} is not an endpoint a batch job takes: "
                         f"{listing(list(ENDPOINTS), 'or')}")
    if url != expected:
        if first:
            raise row.reject(f"url '{url}' does not match model '{model.id}': "
                             f"{job.kind.noun} takes {expected} rows")
        raise row.reject(f"url '{url}' mixes endpoints: this file's rows target {expected}, "
                         "and a file's rows must all target the same endpoint")
    body = request.get("body")
    if not isinstance(body, dict):
        raise row.reject("body must be a JSON object")
    return row, body
