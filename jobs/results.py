"""The result file: chunk results merged in input order into the input's format
(output-format.txt). JSONL rows get the OpenAI batch output envelope; parquet rows keep the
input's columns plus id/row_index, output (or embedding) and error_type. Each row also
carries its share of the job's charge (billing.allocation): "cost": {"credits": "…"} in
the JSONL envelope, a cost_credits decimal column in parquet.

A grouped job's chunks hold rows out of file order (its plan runs rows that share work
together, jobs.validation.grouping): its rows are put back in file order as they are read
(_row_batches), so every reader below (the merge, its costs, a re-run's reads) sees input
order either way."""

from __future__ import annotations

import mmap
import tempfile
from collections.abc import Callable, Iterable, Iterator
from decimal import Decimal, localcontext
from typing import Any, NamedTuple

import msgspec
import numpy as np
import orjson

from billing.allocation import ALLOCATION_CONTEXT, SHARE_PLACES, ChargeAllocator, credits_text
from inference.catalog import CatalogModel, model_get
from inference.constants import InputFormat, RowOutcome
from inference.kinds import kind_named
from inference.pricing import CENTS_PER_USD, usage_cost_usd, usage_from_json
from jobs.constants import TERMINAL_STATUSES
from jobs.jsonl import line_dumps, line_loads
from jobs.models import Chunk, Job
from jobs.storage import storage_for

# The parquet error_type of a row that stopped on the output-token cap.
TRUNCATED_MARKER = "length"
ZERO = Decimal(0)


def _cost_type() -> Any:
    import pyarrow as pa

    return pa.decimal128(38, SHARE_PLACES)


def chunk_key(job: Job, index: int) -> str:
    return f"results/{job.organization_id}/{job.pk}/chunks/{index:06d}.jsonl"


def result_key(job: Job) -> str:
    return f"results/{job.organization_id}/{job.pk}/result.{job.format}"


# Chunk results read at once while merging (RegionStorage.read_each): a GET's wait is
# spent on the rows before it, and at most this many chunk results are held.
READ_AHEAD = 6


def _chunk_results(job: Job, chunks: list[Chunk]) -> Iterator[bytes]:
    """Each chunk's result object whole, in index order, read ahead."""
    return storage_for(job.data_residency).read_each(
        (chunk_key(job, chunk.index) for chunk in chunks), ahead=READ_AHEAD)


def _lines(data: bytes) -> Iterator[bytes]:
    """A chunk result's rows (as iterating its file gives them, blank lines skipped)."""
    return (line for line in data.split(b"\n") if line.strip())


# A grouped job's rows handed back in file order this many at a time.
ORDERED_BATCH = 256
_INDEXED = b'{"i":'


def _row_batches(job: Job, chunks: list[Chunk]) -> Iterator[Iterable[bytes]]:
    """Every delivered row's chunk line, in input order, a batch at a time: a chunk
    result's lines as they are, for chunks of contiguous rows in index order; a grouped
    job's (any chunk with spans) put back in row order (_in_row_order)."""
    if not any(chunk.spans is not None for chunk in chunks):
        for data in _chunk_results(job, chunks):
            yield _lines(data)
        return
    yield from _in_row_order(job, chunks)


def _row_index(line: bytes) -> int:
    """A chunk line's row index: "i", its first member as jobs.services.rows.record
    writes it, read off the line's start; any other line read whole."""
    if line.startswith(_INDEXED):
        return int(line[len(_INDEXED):line.index(b",", len(_INDEXED))])
    return int(line_loads(line)["i"])


def _in_row_order(job: Job, chunks: list[Chunk]) -> Iterator[list[bytes]]:
    """A grouped job's chunk lines in row-index order. Each chunk result is read once
    (read ahead, as the contiguous merge reads them) and its lines appended to a local
    spool, with each line's row index, place and length in three columns (24 bytes a
    row); then the lines are read back from the spool, mapped, in row order. No result is
    held in memory: the spool is a file, the page cache's to keep."""
    indexes: list[np.ndarray] = []
    places: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    position = 0
    with tempfile.TemporaryFile() as spool:
        for data in _chunk_results(job, chunks):
            lines = list(_lines(data))
            if not lines:
                continue
            sizes = np.fromiter(map(len, lines), np.int64, len(lines))
            indexes.append(np.fromiter(map(_row_index, lines), np.int64, len(lines)))
            places.append(position + np.cumsum(sizes) - sizes)
            lengths.append(sizes)
            spool.write(b"".join(lines))
            position += int(sizes.sum())
        if not position:
            return
        spool.flush()
        index = np.concatenate(indexes)
        order = np.argsort(index, kind="stable")
        place, length = np.concatenate(places)[order], np.concatenate(lengths)[order]
        del indexes, places, lengths, index, order
        with mmap.mmap(spool.fileno(), 0, access=mmap.ACCESS_READ) as view:
            for first in range(0, len(place), ORDERED_BATCH):
                yield [view[at:at + size] for at, size in zip(
                    place[first:first + ORDERED_BATCH].tolist(),
                    length[first:first + ORDERED_BATCH].tolist(), strict=True)]


def records(job: Job, chunks: list[Chunk]) -> Iterator[dict[str, Any]]:
    """Every delivered row's record, in input order (chunks are in index order; a
    grouped job's rows put back in order, _row_batches)."""
    for lines in _row_batches(job, chunks):
        for line in lines:
            yield line_loads(line)


def envelope(row: dict[str, Any]) -> dict[str, Any]:
    ident = row["id"]
    produced = row["outcome"] != RowOutcome.ERROR
    out = {
        "id": f"batch_req_{ident}",
        "custom_id": ident,
        "response": {"status_code": row["status_code"], "request_id": f"req_{ident}",
                     "body": row["body"] if produced else None},
        "error": row["error"],
    }
    if "cost" in row:  # additive to the OpenAI envelope (docs/output-format.md)
        out["cost"] = {"credits": row["cost"]}
    return out


def _error_type(row: dict[str, Any]) -> str | None:
    if row["outcome"] == RowOutcome.TRUNCATED:
        return TRUNCATED_MARKER
    return (row["error"] or {}).get("type") if row["outcome"] != RowOutcome.SUCCESS else None


def _row_weight(row: dict[str, Any], model: CatalogModel | None) -> Decimal:
    """A row's exact price in credits, before any rounding: what it is charged a share by."""
    return _usage_weight(row.get("usage"), model)


def _usage_weight(usage: dict[str, Any] | None, model: CatalogModel | None) -> Decimal:
    if model is None or not usage:
        return ZERO
    return usage_cost_usd(model, usage_from_json(usage)) * CENTS_PER_USD


class _Weighed(msgspec.Struct):
    """What the merge's first pass reads of a row: its outcome and usage, the rest of the
    line skipped rather than built (a tenth of reading it whole)."""

    outcome: str
    usage: dict[str, Any] | None = None


class _Enveloped(msgspec.Struct):
    """What the JSONL merge reads of a row: its outcome and usage to weigh it, and what its
    envelope takes, the body and the error kept as the chunk wrote them (msgspec.Raw: found,
    not built) and written back as they are (orjson.Fragment): a row's answer (an
    embedding's hundreds of floats) is never parsed or dumped again."""

    id: str
    status_code: int
    outcome: str
    error: msgspec.Raw = msgspec.Raw(b"null")
    body: msgspec.Raw = msgspec.Raw(b"null")
    usage: dict[str, Any] | None = None


_WEIGHED = msgspec.json.Decoder(_Weighed)
_ENVELOPED = msgspec.json.Decoder(_Enveloped)
# A merge keeps its rows between its two passes in memory up to this size, on local disk
# past it (a 2,000-row embedding job's 16 MB stays in memory; a 10M-row job goes to disk).
SPOOL_MEMORY_BYTES = 64 * 1024 * 1024
# Distinct usages a merge remembers the weight of (_Weights); past it each is priced anew.
WEIGHTS_KEPT = 65_536


def _weighed(line: bytes) -> tuple[str, dict[str, Any] | None]:
    """A row's outcome and usage; a line msgspec refuses is read whole, as line_loads
    reads it (jobs.jsonl)."""
    try:
        item = _WEIGHED.decode(line)
    except msgspec.DecodeError:
        row = line_loads(line)
        return row["outcome"], row.get("usage")
    return item.outcome, item.usage


def _enveloped(line: bytes) -> tuple[str, dict[str, Any] | None, bytes]:
    """A row's outcome, usage and result line without its cost: envelope() of the row,
    written. A line msgspec refuses is read whole and written whole, as before."""
    try:
        item = _ENVELOPED.decode(line)
    except msgspec.DecodeError:
        row = line_loads(line)
        return row["outcome"], row.get("usage"), line_dumps(envelope(row))
    ident = item.id
    produced = item.outcome != RowOutcome.ERROR
    return item.outcome, item.usage, orjson.dumps({
        "id": f"batch_req_{ident}",
        "custom_id": ident,
        "response": {"status_code": item.status_code, "request_id": f"req_{ident}",
                     "body": orjson.Fragment(bytes(item.body)) if produced else None},
        "error": orjson.Fragment(bytes(item.error)),
    }, option=orjson.OPT_APPEND_NEWLINE)


class _Weights:
    """_usage_weight, remembered by the usage's items: a job's rows mostly share a few
    usages (an embedding job's differ by their token count alone), each priced once."""

    def __init__(self, model: CatalogModel | None) -> None:
        self.model = model
        self.known: dict[tuple[tuple[str, Any], ...], Decimal] = {}

    def __call__(self, usage: dict[str, Any] | None) -> Decimal:
        key = tuple(usage.items()) if usage else ()
        try:
            weight = self.known.get(key)
        except TypeError:  # a value that is not a scalar: priced, not remembered
            return _usage_weight(usage, self.model)
        if weight is None:
            weight = _usage_weight(usage, self.model)
            if len(self.known) < WEIGHTS_KEPT:
                self.known[key] = weight
        return weight


def _costed(job: Job, chunks: list[Chunk], *, charge: int,
            keep: Callable[[bytes], tuple[str, dict[str, Any] | None, bytes]],
            ) -> Iterator[tuple[memoryview, str]]:
    """Each row's kept text (`keep` of its chunk line, as a view of the spool's line) and
    its share of the job's `charge`
    (billing.allocation: in proportion to the rows' exact prices, adding up to the charge
    exactly). Two passes over the rows, one to weigh, one to hand out; the chunk results
    are read from storage once, by the first, which keeps each row in a spool for the
    second, behind its exact weight and whether it is billed (text, then a tab: a JSON line
    holds no raw tab), so a row is priced once and read once. No row is held."""
    model = model_get(job.model)
    total, billed = ZERO, 0
    weigh = _Weights(model)
    with tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES) as spool:
        with localcontext(ALLOCATION_CONTEXT):
            for lines in _row_batches(job, chunks):
                weighed: list[bytes] = []
                for line in lines:
                    outcome, usage, kept = keep(line)
                    weight = weigh(usage)
                    total += weight
                    bills = outcome != RowOutcome.ERROR
                    billed += bills
                    weighed += (str(weight).encode(), b"\t", b"1" if bills else b"0",
                                b"\t", kept.rstrip(b"\n"), b"\n")
                spool.write(b"".join(weighed))
        # Zero rates (or results written before rows carried their usage): an even split
        # over the billed rows.
        even = not total
        allocator = ChargeAllocator(charge=charge,
                                    total_weight=Decimal(billed) if even else total)
        spool.seek(0)
        for entry in spool:  # weight, a tab, 1 or 0 (billed), a tab, the text, a newline
            tab = entry.index(b"\t")
            weight = Decimal(entry[tab + 1] == ord("1")) if even \
                else Decimal(entry[:tab].decode())
            # The text is not copied out of its line (an embedding row's is some 8 KB).
            yield memoryview(entry)[tab + 3:-1], credits_text(allocator.share(weight))


def records_costed(job: Job, chunks: list[Chunk], *, charge: int) -> Iterator[dict[str, Any]]:
    """records() with each row's share of the job's `charge` as "cost" (_costed)."""
    for line, cost in _costed(job, chunks, charge=charge,
                              keep=lambda line: (*_weighed(line), line)):
        yield {**line_loads(bytes(line)), "cost": cost}


# How an envelope ends when its row has no error: "error" is its last member, written by
# orjson (as chunk rows are), so a null is exactly these bytes before the closing brace.
_NO_ERROR = b'"error":null}'


def lines_costed(job: Job, chunks: list[Chunk], *,
                 charge: int) -> Iterator[tuple[bytes, bool]]:
    """The JSONL result's lines: each row's envelope() with its share of the job's `charge`
    as "cost", its last member (_costed, _enveloped), as rows_write writes records_costed's
    rows, without reading any row's answer; and whether the row has an error."""
    for line, cost in _costed(job, chunks, charge=charge, keep=_enveloped):
        failed = bytes(line[-len(_NO_ERROR):]) != _NO_ERROR
        # The envelope's closing brace gives way to its last member.
        yield (b"".join((line[:-1], b',"cost":{"credits":', orjson.dumps(cost), b"}}\n")),
               failed)


def line_uncosted(line: bytes) -> bytes:
    """A chunk line's result line before the job is priced (GET /jobs/{id}/rows while it
    runs): envelope() of its row as lines_costed writes it (_enveloped), less the cost
    member. The result file's line is this one with `,"cost":{"credits":…}` put before its
    closing brace."""
    return _enveloped(line)[2]


def chunk_result_lines(data: bytes) -> Iterator[bytes]:
    """A contiguous chunk's result object's rows, in row order (_lines)."""
    return _lines(data)


def rows_in_order(job: Job, chunks: list[Chunk]) -> Iterator[tuple[int, bytes]]:
    """These chunks' rows (any plan) with each row's index, in row-index order
    (_in_row_order's spool: no result held in memory)."""
    for batch in _in_row_order(job, chunks):
        for line in batch:
            yield _row_index(line), line


# A JSONL result's line marks: the byte where every LINE_MARK_EVERY-th line starts, so a
# page of a finished job's rows (jobs.services.pages) reads from the mark before its first
# line, not from the file's start (10M rows: 2,442 marks).
LINE_MARK_EVERY = 4096


class ResultWritten(NamedTuple):
    """A result file written: its key, its rows, (JSONL) the bytes of its lines with no
    error and with one - the OpenAI surface's output and error files - and its line marks
    (marks[k] is where line (k + 1) x LINE_MARK_EVERY + 1 starts, numbering from 1)."""

    key: str
    rows: int
    output_bytes: int | None = None
    error_bytes: int | None = None
    marks: list[int] | None = None


def result_write(job: Job, chunks: list[Chunk], *, charge: int = 0) -> ResultWritten:
    """Write the result object, each row carrying its share of `charge` (the credits the
    job is charged); what was written, counted as it was."""
    key = result_key(job)
    if job.format != InputFormat.JSONL:
        return ResultWritten(key, rows_write(job, records_costed(job, chunks, charge=charge),
                                             key))
    count, sizes, marks = 0, [0, 0], []

    def counted() -> Iterator[bytes]:
        nonlocal count
        for line, failed in lines_costed(job, chunks, charge=charge):
            if count and not count % LINE_MARK_EVERY:
                marks.append(sizes[0] + sizes[1])
            count += 1
            sizes[failed] += len(line)
            yield line

    storage_for(job.data_residency).write_stream(key, counted(), max_bytes=2**62)
    return ResultWritten(key, count, output_bytes=sizes[False], error_bytes=sizes[True],
                         marks=marks)


class _Failed(msgspec.Struct):
    """What a result line is read for to know its part: its envelope's error, found and
    not built."""

    error: msgspec.Raw = msgspec.Raw(b"null")


_FAILED = msgspec.json.Decoder(_Failed)


def result_line_failed(line: bytes) -> bool:
    """Whether a written JSONL result line's row has an error (the OpenAI surface's error
    file): the split result_write counts as it writes (lines_costed). Read as the merge
    reads rows (msgspec; a line it refuses by line_loads, which refuses NaN as it does)."""
    try:
        return bytes(_FAILED.decode(line).error) != b"null"
    except msgspec.DecodeError:
        return line_loads(line).get("error") is not None


def result_lines(job: Job) -> Iterator[tuple[bytes, bool]]:
    """The finished job's JSONL result file, line by line as written (each ending in its
    newline; a blank line is no row), each with whether its row has an error."""
    with storage_for(job.data_residency).open(job.result_key) as stream:
        for line in stream:
            if line.strip():
                line = line if line.endswith(b"\n") else line + b"\n"
                yield line, result_line_failed(line)


def rows_write(job: Job, rows: Iterator[dict[str, Any]], key: str) -> int:
    """Write these records (in input order, "i" the row's index in the job's input) as a
    result file of the job's format at `key`; returns how many rows it holds."""
    storage = storage_for(job.data_residency)
    if job.format == InputFormat.JSONL:
        count = [0]

        def lines() -> Iterator[bytes]:
            for row in rows:
                count[0] += 1
                yield line_dumps(envelope(row))

        storage.write_stream(key, lines(), max_bytes=2**62)
        return count[0]
    return _parquet_write(job, rows, key)


def _parquet_write(job: Job, results: Iterator[dict[str, Any]], key: str) -> int:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from jobs.services.rows import input_parquet_path

    source = pq.ParquetFile(input_parquet_path(job))
    has_id = "id" in source.schema_arrow.names
    kind = kind_named(job.task_type)
    pending = next(results, None)
    written = 0
    with tempfile.NamedTemporaryFile(suffix=".parquet") as local:
        writer: pq.ParquetWriter | None = None
        row_index = 0
        for batch in source.iter_batches(batch_size=4096):
            take, delivered, error_types = [], [], []
            for offset in range(batch.num_rows):
                if pending is not None and pending["i"] == row_index:
                    take.append(offset)
                    delivered.append(pending)
                    error_types.append(_error_type(pending))
                    pending = next(results, None)
                row_index += 1
            if not take:
                continue
            table = pa.Table.from_batches([batch]).take(take)
            if not has_id:
                table = table.append_column("row_index", pa.array(
                    [row_index - batch.num_rows + i for i in take], pa.int64()))
            # The row's output, or its vector: the kind's column.
            table = table.append_column(*kind.parquet_output(delivered))
            table = table.append_column("error_type", pa.array(error_types, pa.string()))
            table = table.append_column("cost_credits", pa.array(
                [Decimal(row["cost"]) if "cost" in row else None for row in delivered],
                _cost_type()))
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


# How long a result link stays good (GET /jobs/{id}/result, the job.completed webhook).
RESULT_LINK_SECONDS = 3600


def result_download_url(job: Job) -> str | None:
    """A fresh presigned link to the job's result file, valid RESULT_LINK_SECONDS; None
    while it has none (not finished, no rows delivered, its data deleted)."""
    if job.data_deleted_at is not None or job.status not in TERMINAL_STATUSES \
            or not job.result_key:
        return None
    return storage_for(job.data_residency).download_url(
        job.result_key, expires_in=RESULT_LINK_SECONDS, filename=f"{job.pk}.{job.format}")
