"""JSONL framing and the request envelope: one OpenAI-batch request object per line, all of
them for the one endpoint the job's model serves.

The file is read a block of whole lines at a time and each row is dropped once checked;
what is kept across rows is a handful of running sums and about 30 bytes for every
custom_id (jobs.validation.ids.IdSet), so a million-row file validates in bounded memory.
The first violation stops the read (in collect mode, a preflight check's, every violation
is recorded and the read goes on).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

from inference.rows.core import (
    ENDPOINTS,
    CountPlan,
    CountTokens,
    FileReport,
    JobOptions,
    PreparedRows,
    ProbeContentType,
    RowRef,
    RowRejected,
    TextTooLong,
    listing,
    thousands,
)
from jobs.jsonl import BOM, line_loads, line_row
from jobs.validation.core import CountBatch, FileContext, RowError, RowErrors, Tally
from jobs.validation.ids import IdSet
from jobs.validation.layout import RowLayout

# The codes OpenAI's batch validation gives these rules (RowRejected.code).
INVALID_JSON = "invalid_json_line"
URL_MISMATCH = "url_mismatch"
_NEWLINE = ord("\n")
# A block: about 2,500 short chat rows, decoded together by the fast lane (a few MB of
# Python objects at a time, whatever the file holds).
_READ_BYTES = 256 * 1024


def validate_jsonl(stream: BinaryIO, options: JobOptions, *, count_tokens: CountTokens,
                   probe_content_type: ProbeContentType | None = None,
                   errors: RowErrors | None = None,
                   layout: RowLayout | None = None) -> FileReport:
    """Check every line of a JSONL input against the job, and count what it consumes.

    Raises RowRejected (naming the row or line) at the first violation, InputRejected for a
    file with no rows. `count_tokens` is the model's tokenizer; `probe_content_type` answers
    a HEAD request's Content-Type (None when the host did not answer). With `errors` (a
    preflight check), each violation is recorded there instead and the read goes on: the
    report then counts the rows that passed. With `layout` (a job's estimate), where the
    rows lie is recorded there as the blocks are read (jobs.validation.layout).

    The file is read a block of whole lines at a time. A block goes through its kind's
    fast lane (inference/rows/fast.py: typed decoding of every line at once, checks and
    counts over the block) where the kind has one and the block is plainly valid; any
    block the fast lane does not take whole is checked line by line here, by the same
    rules, which name its first failing row. Both lanes add the same sums."""
    job = FileContext(options, count_tokens, probe_content_type)
    job.deferring = True  # text-only rows are counted COUNT_BATCH_ROWS at a time
    check = _LineCheck(job, errors)
    # The fast lane reads no body.model: a file whose rows must name it goes line by line.
    fast = None if options.row_model else job.kind.fast_rows(job)
    # A block's count runs on this thread while the next block is decoded and rendered
    # (the tokenizer leaves the GIL); one count at a time, in file order.
    counter = ThreadPoolExecutor(1, "count") if fast is not None and job.counts_apart \
        else None
    try:
        for number, lines, chunk in chunks_bounded(stream, job.line_max_bytes,
                                                   skip_long=errors is not None):
            if layout is not None:
                layout.block(number, lines, chunk)
            prepared = None
            if fast is not None and chunk is not None and not (
                    number == 1 and chunk.startswith(BOM)):
                prepared = fast.prepare(chunk, lines)
            check.settle_waiting()
            if chunk is None:  # collect mode: an over-long line, skipped unread
                assert errors is not None
                check.batch.flush(check.on_reject)  # the rows before it are reported first
                errors.add(RowError(line_too_long(number, job.line_max_bytes).message,
                                    line=number))
                continue
            if prepared is None or check.blank_since is not None:
                check.chunk(number, chunk)
                continue
            plan = job.count_plan(prepared.texts)
            check.waiting = _Counting(number, chunk, prepared, plan,
                                      counter.submit(plan.encode) if counter is not None
                                      else plan.encode())
            if counter is None:
                check.settle_waiting()
        check.settle_waiting()
    except RowRejected:  # chunks_bounded's over-long line: an earlier row's failure first
        check.settle_waiting()
        check.batch.flush(check.on_reject)
        raise
    finally:
        if counter is not None:
            counter.shutdown(cancel_futures=True)
    check.batch.flush(check.on_reject)
    return check.tally.report(job, errors=errors)


@dataclass(frozen=True, slots=True)
class _Counting:
    """A fast-lane block whose texts are being counted."""

    number: int
    chunk: bytes
    prepared: PreparedRows
    plan: CountPlan
    encoded: Future[list[int]] | list[int]


class _LineCheck:
    """The line-by-line lane, and the state both lanes share: the running sums, the rows
    waiting for their batch count, the custom_ids seen, and a run of blank lines not yet
    reported (it is reported when a request line follows it; blank lines ending the file
    are let be)."""

    def __init__(self, job: FileContext, errors: RowErrors | None) -> None:
        self.job = job
        self.errors = errors
        self.tally = Tally(job.kind.endpoint)
        self.batch = CountBatch(job, self.tally)
        self.ids = IdSet()
        self.blank_since: int | None = None
        # A fast-lane block whose count is running while the next block is prepared.
        self.waiting: _Counting | None = None
        self.on_reject = None if errors is None else self._recorded

    def _recorded(self, rejected: RowRejected, where: object) -> None:
        assert self.errors is not None and isinstance(where, tuple)
        number, request = where
        self.errors.add(RowError(rejected.message, line=number,
                                 custom_id=_custom_id(request), code=rejected.code))

    def settle_waiting(self) -> None:
        """The fast-lane block being counted, once counted: its sums, or (a row does not
        fit, an id was seen) its lines one by one. Taken off `waiting` first, so a
        rejection raised here never settles it twice."""
        counting, self.waiting = self.waiting, None
        if counting is None:
            return
        encoded = counting.encoded
        block = counting.prepared.cost(counting.plan.finish(
            encoded.result() if isinstance(encoded, Future) else encoded))
        if block is not None and self.ids.fresh(block.identities):
            self.tally.add_block(block)
        else:
            self.chunk(counting.number, counting.chunk)

    def chunk(self, number: int, chunk: bytes) -> None:
        """Every line of a block of whole lines, in order, the first numbered `number`."""
        lines = chunk.split(b"\n")
        if chunk.endswith(b"\n"):
            lines.pop()
        parsed = [self._parsed(line, number + at) for at, line in enumerate(lines)]
        self.ids.begin([request["custom_id"] for _, request in parsed
                        if type(request) is dict and type(request.get("custom_id")) is str])
        for at, (line, request) in enumerate(parsed):
            self._line(number + at, line, request)
        self.ids.end()

    def _parsed(self, raw: bytes, number: int) -> tuple[bytes, object]:
        """The line stripped, and its request, or the RowRejected its JSON earns."""
        line = line_row(raw, first=number == 1)
        if not line:
            return line, None
        try:
            # The run's own reader (jobs.jsonl): NaN, Infinity and lone surrogates refused
            return line, line_loads(line)
        except ValueError as error:  # JSONDecodeError, and UnicodeDecodeError for non-UTF-8
            detail = f" ({error.msg} at column {error.colno})" \
                if isinstance(error, json.JSONDecodeError) else ""
            return line, _at(number).reject(f"not valid JSON{detail}; each line must be one "
                                            "request object", code=INVALID_JSON)
        except RecursionError:  # thousands of nested brackets: refused, never a crash
            return line, _at(number).reject("not valid JSON (nested too deeply); each line "
                                            "must be one request object", code=INVALID_JSON)

    def _line(self, number: int, line: bytes, request: object) -> None:
        job, batch, errors = self.job, self.batch, self.errors
        if not line:
            self.blank_since = self.blank_since or number
            return
        if self.blank_since is not None:
            batch.flush(self.on_reject)
            blank = RowRef.line(self.blank_since).reject(
                "the line is blank; a JSONL input has one request per line and no blank "
                "lines between them"
            )
            if errors is None:
                raise blank
            errors.add(RowError(blank.message, line=self.blank_since), row=False)
            self.blank_since = None
        try:
            if isinstance(request, RowRejected):
                raise request
            row, body = _envelope(request, number, ids=self.ids, job=job,
                                  first=self.tally.rows == 0 and not batch.pending)
            try:
                batch.add(row, job.kind.row_cost(body, job=job, row=row), (number, request))
            except TextTooLong as too_long:
                raise too_long.reject(row, job.model) from None
        except RowRejected as rejected:
            batch.flush(self.on_reject)  # an earlier row's failure comes first
            if errors is None:
                raise
            errors.add(RowError(rejected.message, line=number, custom_id=_custom_id(request),
                                code=rejected.code))


def _custom_id(request: object) -> str | None:
    """A failing line's custom_id, when it has a readable one (collect mode only)."""
    value = request.get("custom_id") if isinstance(request, dict) else None
    return value if isinstance(value, str) and value else None


def chunks_bounded(stream: BinaryIO, max_bytes: int, *,
                   skip_long: bool = False) -> Iterator[tuple[int, int, bytes | None]]:
    """The stream's lines, a block of whole lines at a time (about _READ_BYTES), each with
    the number of its first line and how many lines it holds; read from any object with
    read() (a local file or an S3 body alike). A line longer than max_bytes is refused as
    soon as that many bytes of it are read, so memory stays bounded by the cap whatever the
    file holds; with skip_long it is read past instead and stands as None (collect mode).
    The last line may lack its newline."""
    limit = line_limit(max_bytes)
    number = 1
    carry: list[bytes] = []  # the start of a line that runs past the blocks read so far
    size = 0
    skipping = False
    # The first blocks are small and grow to _READ_BYTES: a block is checked while the one
    # before it is counted, so a short file's pipeline fills (and drains) sooner.
    reads = max(_READ_BYTES // 8, 1)
    while block := stream.read(reads):
        reads = min(reads * 2, _READ_BYTES)
        cut = block.rfind(b"\n")
        if cut < 0:  # no line ends in this block
            if not skipping:
                carry.append(block)
                size += len(block)
                if size > limit:
                    if not skip_long:
                        raise line_too_long(number, max_bytes)
                    carry, size, skipping = [], 0, True
            continue
        whole, rest = block[:cut + 1], block[cut + 1:]
        if carry or skipping:
            end = whole.index(b"\n")
            if skipping or size + end > limit:
                if not skip_long:
                    raise line_too_long(number, max_bytes)
                yield number, 1, None
                number += 1
                whole = whole[end + 1:]
            else:  # the carried line joins this block: its pieces are copied once
                whole = b"".join([*carry, whole])
            carry, size, skipping = [], 0, False
        if whole:
            lines = newlines(whole)
            yield number, lines, whole
            number += lines
        if rest:
            carry, size = [rest], len(rest)
    if skipping:
        yield number, 1, None
    elif carry:
        yield number, 1, b"".join(carry)


def newlines(chunk: bytes) -> int:
    """How many b"\\n" chunk holds: compared a vector at a time (bytes.count goes a byte at a
    time, a tenth of the checker's time on short rows)."""
    return int(np.count_nonzero(np.frombuffer(chunk, np.uint8) == _NEWLINE))


def line_limit(max_bytes: int) -> int:
    """The most bytes a line may hold before its newline under a cap of max_bytes: a \r
    before the newline does not count against the cap. (chunks_bounded reads by it, and
    an OpenAI batch's create judges the lines it has read by it, openai_api.batches.)"""
    return max_bytes + 1


def line_too_long(number: int, max_bytes: int) -> RowRejected:
    """A line over the cap of its model's rows (also what an OpenAI batch's create answers
    for one before its job exists, openai_api.batches)."""
    return RowRef.line(number).reject(
        f"the line is longer than {thousands(max_bytes)} bytes, the most one request line "
        "may take; shorten or split this request")


def _at(number: int) -> RowRef:
    # Made only when a line fails: most lines never need their reference.
    return RowRef.line(number)


def _envelope(request: object, number: int, *, ids: IdSet, job: FileContext,
              first: bool) -> tuple[RowRef, dict[str, object]]:
    """The request object around the body: custom_id, method, url, body."""
    if not isinstance(request, dict):
        raise _at(number).reject("not a JSON object; each line must be one request object with "
                           "custom_id, method, url and body", code=INVALID_JSON)
    custom_id = request.get("custom_id")
    if custom_id is None:
        raise _at(number).reject("custom_id is missing; every line needs a custom_id string")
    if not isinstance(custom_id, str) or not custom_id:
        raise _at(number).reject(f"custom_id must be a non-empty string, not {custom_id!r}")
    row = RowRef.named(custom_id)
    if not ids.add(custom_id):
        raise row.reject("custom_id is used by an earlier line; every row needs its own "
                         "custom_id", code="duplicate_custom_id")
    if request.get("method") != "POST":
        raise row.reject(f"method must be \"POST\", not {request.get('method')!r}")
    url = request.get("url")
    model = job.model
    expected = job.kind.endpoint
    if url not in ENDPOINTS:
        raise row.reject(f"url {url!r} is not an endpoint a batch job takes: "
                         f"{listing(list(ENDPOINTS), 'or')}", code=URL_MISMATCH)
    if url != expected:
        if first:
            raise row.reject(f"url '{url}' does not match model '{model.id}': "
                             f"{job.kind.noun} takes {expected} rows", code=URL_MISMATCH)
        raise row.reject(f"url '{url}' mixes endpoints: this file's rows target {expected}, "
                         "and a file's rows must all target the same endpoint",
                         code=URL_MISMATCH)
    body = request.get("body")
    if not isinstance(body, dict):
        raise row.reject("body must be a JSON object")
    if job.options.row_model and body.get("model") != model.id:
        named = body.get("model")
        raise row.reject(
            (f"body.model is {named!r}, and this batch runs '{model.id}' (the model its "
             "first row names): one batch runs one model" if named is not None else
             f"body.model is missing; every row names its model ('{model.id}' here)"),
            code="model_mismatch")
    return row, body
