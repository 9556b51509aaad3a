"""Parquet inputs (docs/dev/decisions/2026-12-01-inputs-and-results.md): chat rows from a `prompt`
column (text) or a `messages` column (JSON text, or a native list of message structs), embedding
rows from an `input` column (each kind's ParquetReading, inference.kinds); an `id` column is
the row identity, else the row's row_index.

Read a record batch at a time, only the columns the checks need, so a large file is never
held whole in memory. Parquet rows carry no per-row thinking, effort, response_format or
dimensions (output-format.txt): the job's settings apply to every row.

A few kilobytes of parquet can declare billions of rows, or one 10 MB dictionary value that
every row repeats: what a file declares is checked against the input cap before anything is
read (rows, row groups), strings are read dictionary-encoded so a repeated value is held
once, and each row's decoded size is measured from the arrays before any Python value is
made (docs/dev/decisions/2026-12-01-inputs-and-results.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from django.conf import settings

from inference.kinds import ParquetReading
from inference.rows.core import (
    CountTokens,
    FileReport,
    InputRejected,
    JobOptions,
    ProbeContentType,
    RowRef,
    RowRejected,
    TextTooLong,
    thousands,
)
from jobs.validation.core import CountBatch, FileContext, RowError, RowErrors, Tally
from jobs.validation.ids import DigestSet

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

BATCH_ROWS = 4096
ID = "id"
# The shortest JSONL request line is longer than this: a parquet input may hold as many
# rows as a JSONL input under the input cap could, and as many bytes of content.
MIN_ROW_BYTES = 64
# What one row group's columns may decode to: pyarrow decodes a column chunk whole.
ROW_GROUP_MAX_BYTES = 1024**3
# Python values are made this many bytes at a time, whatever the batch's row count.
SLICE_BYTES = 64 * 1024 * 1024


def validate_parquet(source: str | Path | IO[bytes], options: JobOptions, *,
                     count_tokens: CountTokens,
                     probe_content_type: ProbeContentType | None = None,
                     errors: RowErrors | None = None) -> FileReport:
    """The parquet twin of validate_jsonl: same rules, same report, same rejections, and
    the same collect mode (`errors`). There a row over the size a request may take stops
    the read too: its size is measured a batch at a time, before its value exists."""
    job = FileContext(options, count_tokens, probe_content_type)
    model, kind = job.model, job.kind
    reading = kind.parquet
    if reading is None:
        raise InputRejected(kind.parquet_refusal(model))
    try:
        parquet = parquet_open(source)
    except Exception as error:  # pyarrow raises its own ArrowInvalid/OSError family
        raise InputRejected(f"The input is not a readable parquet file ({error}).") from None
    content, identity = parquet_columns(parquet, reading)
    parquet_declared_check(parquet, content, identity)
    tally = Tally(kind.endpoint)
    job.deferring = True  # text-only rows are counted COUNT_BATCH_ROWS at a time
    batch = CountBatch(job, tally)

    def recorded(rejected: RowRejected, where: object) -> None:
        assert errors is not None and isinstance(where, tuple)
        row_index, name = where
        errors.add(RowError(rejected.message, row_index=row_index,
                            custom_id=None if name is None or name == "" else str(name)))

    on_reject = None if errors is None else recorded
    ids = DigestSet()
    rows = parquet_rows(parquet, content, identity, max_value_bytes=job.line_max_bytes)
    try:
        for row_index, name, value in rows:
            try:
                row = _row_ref(row_index, name, identity, ids)
                try:
                    cost = reading.row_cost(content, value, job=job, row=row)
                except TextTooLong as too_long:
                    raise too_long.reject(row, model) from None
            except RowRejected as rejected:
                batch.flush(on_reject)  # an earlier row's failure comes first
                if errors is None:
                    raise
                recorded(rejected, (row_index, name))
                continue
            batch.add(row, cost, (row_index, name))
    except RowRejected as oversized:  # parquet_rows': a row over the size a request takes
        batch.flush(on_reject)
        if errors is None:
            raise
        errors.add(RowError(oversized.message))
    batch.flush(on_reject)
    return tally.report(job, errors=errors)


def parquet_open(source: str | Path | IO[bytes]) -> pq.ParquetFile:
    """The file with every string column read dictionary-encoded: a value repeated by a
    million rows is one value in memory, not a million copies, until a row asks for it."""
    import pyarrow.parquet as pq

    footer = pq.ParquetFile(source)
    schema = footer.schema
    strings = [schema.column(i).path for i in range(len(schema))
               if schema.column(i).physical_type == "BYTE_ARRAY"]
    return pq.ParquetFile(source, metadata=footer.metadata, read_dictionary=strings)


def _input_cap() -> int:
    return int(settings.ANEX_INPUT_MAX_BYTES)


def parquet_declared_check(parquet: pq.ParquetFile, content: str,
                           identity: str | None) -> None:
    """What the footer declares, refused before any row is read: more rows than a JSONL
    input under the cap could hold, or a row group whose columns decode to over 1 GiB."""
    metadata = parquet.metadata
    max_rows = _input_cap() // MIN_ROW_BYTES
    if metadata.num_rows > max_rows:
        raise InputRejected(
            f"The parquet file declares {thousands(metadata.num_rows)} rows; an input holds "
            f"at most {thousands(max_rows)}. Split it into several jobs.")
    wanted = {content} if identity is None else {content, identity}
    for group in range(metadata.num_row_groups):
        row_group = metadata.row_group(group)
        size = sum(row_group.column(i).total_uncompressed_size
                   for i in range(row_group.num_columns)
                   if row_group.column(i).path_in_schema.split(".")[0] in wanted)
        if size > ROW_GROUP_MAX_BYTES:
            raise InputRejected(
                f"Row group {group} of the parquet file decodes to {thousands(size)} bytes; "
                f"a row group may take at most {thousands(ROW_GROUP_MAX_BYTES)}. Write the "
                "file with smaller row groups.")


def parquet_columns(parquet: pq.ParquetFile,
                    reading: ParquetReading) -> tuple[str, str | None]:
    """The column a row's content comes from (the kind's), and the identity column if
    there is one."""
    columns = set(parquet.schema_arrow.names)
    return reading.content_column(columns), ID if ID in columns else None


def parquet_rows(parquet: pq.ParquetFile, content: str, identity: str | None, *,
                 start: int = 0, max_value_bytes: int | None = None,
                 ) -> Iterator[tuple[int, Any, Any]]:
    """(row_index, id, content) from `start` on, a record batch at a time; whole row
    groups before `start` are skipped without being read. Each row's size is measured
    before its value is made: with max_value_bytes, a row over it, or a file whose content
    comes to more than the input cap, is refused (RowRejected/InputRejected)."""
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
    content_cap, decoded = _input_cap(), 0
    for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=wanted,
                                      row_groups=groups):
        sizes = _value_bytes(batch.column(content))
        if identity:
            sizes = sizes + _value_bytes(batch.column(identity))
        if max_value_bytes is not None:
            over = (sizes > max_value_bytes).nonzero()[0]
            if len(over):
                raise RowRef.index(row_index + int(over[0])).reject(
                    f"the row is {thousands(int(sizes[over[0]]))} bytes, more than the "
                    f"{thousands(max_value_bytes)} one request may take; shorten or split "
                    "this row")
            decoded += int(sizes.sum())
            if decoded > content_cap:
                raise InputRejected(
                    f"The parquet file's rows come to more than {thousands(content_cap)} "
                    "bytes once decoded, over the input cap. Split it into several jobs.")
        for first, end in _slices(sizes):
            values = batch.column(content).slice(first, end - first).to_pylist()
            names = batch.column(identity).slice(first, end - first).to_pylist() \
                if identity else [None] * len(values)
            for name, value in zip(names, values, strict=True):
                if row_index >= start:
                    yield row_index, name, value
                row_index += 1


def _slices(sizes: np.ndarray) -> Iterator[tuple[int, int]]:
    """[first, end) ranges of a batch's rows, each at most SLICE_BYTES (or one row)."""
    first, total = 0, 0
    for position, size in enumerate(sizes.tolist()):
        if position > first and total + size > SLICE_BYTES:
            yield first, position
            first, total = position, 0
        total += size
    if first < len(sizes):
        yield first, len(sizes)


def _value_bytes(array: pa.Array) -> np.ndarray:
    """Each row's decoded size in bytes (strings and binaries by length, other leaves by
    width), computed on the arrays themselves: no Python value is made, and a dictionary
    value repeated by every row is measured once."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = array.type
    count = len(array)
    if pa.types.is_dictionary(kind):
        per_value = _value_bytes(array.dictionary)
        indices = array.indices.fill_null(0).to_numpy(zero_copy_only=False)
        sizes = per_value[indices] if len(per_value) else np.zeros(count, np.int64)
        return np.where(array.is_null().to_numpy(zero_copy_only=False), 0, sizes)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) \
            or pa.types.is_binary(kind) or pa.types.is_large_binary(kind):
        return pc.binary_length(array).fill_null(0).to_numpy(
            zero_copy_only=False).astype(np.int64)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind) \
            or pa.types.is_fixed_size_list(kind):
        values = array.flatten()
        parents = pc.list_parent_indices(array).to_numpy(zero_copy_only=False)
        return np.bincount(parents, weights=_value_bytes(values),
                           minlength=count).astype(np.int64)
    if pa.types.is_struct(kind):
        total = np.zeros(count, np.int64)
        for child in array.flatten():
            total += _value_bytes(child)
        return total
    width = kind.bit_width // 8 if pa.types.is_primitive(kind) else 8
    return np.full(count, max(width, 1), np.int64)


def _row_ref(row_index: int, name: Any, identity: str | None, ids: DigestSet) -> RowRef:
    if identity is None:
        return RowRef.index(row_index)  # row_index is unique by construction
    if name is None or name == "":
        raise RowRef.index(row_index).reject("id is empty; an id column names every row")
    row = RowRef.named(str(name))
    if not ids.add(str(name)):
        raise row.reject("id is used by an earlier row; every row needs its own id")
    return row

