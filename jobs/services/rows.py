"""A chunk's rows: read from the input (a parquet row as the request body its kind reads it
as), and each served row turned into the record the chunk's results object keeps (one JSON
line per row). What a row's body becomes for the engine, and what its outcome becomes, is
its kind's (inference.kinds).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from inference.constants import InputFormat
from inference.kinds import ServedRow, kind_named
from inference.kinds.base import InputRow
from jobs.constants import TERMINAL_STATUSES
from jobs.jsonl import line_loads, line_row, range_rows
from jobs.models import Chunk, Job
from jobs.storage import LocalRegionStorage, storage_for
from jobs.validation.parquet import parquet_columns, parquet_open, parquet_rows

# Downloaded parquet inputs on this machine (an S3 object is fetched once per job, not per
# chunk), one folder per job: a job's purge removes its folder, a job that has ended loses
# its folder at the next parquet read here, and the whole cache is kept under
# PARQUET_CACHE_MAX_BYTES, the least recently read jobs going first.
PARQUET_CACHE = Path(tempfile.gettempdir()) / "anex-parquet-inputs"
PARQUET_CACHE_MAX_BYTES = 10 * 1024**3
_CACHED_INPUT = "input.parquet"


def input_parquet_path(job: Job) -> Path:
    assert job.input is not None
    storage = storage_for(job.data_residency)
    if isinstance(storage, LocalRegionStorage):
        # Read in place: checked to be the frozen file (its size and mtime) first.
        storage.read_range(job.input.object_key, 0, 0, pin=job.input.content_pin)
        return storage.path(job.input.object_key)
    parquet_cache_prune(keep=job.pk)
    folder = PARQUET_CACHE / str(job.pk)
    path = folder / _CACHED_INPUT
    if path.exists():
        path.touch()  # recently read: evicted last
        return path
    folder.mkdir(parents=True, exist_ok=True)
    fd, partial = tempfile.mkstemp(dir=folder, prefix=".partial-")
    try:
        with storage.open(job.input.object_key, pin=job.input.content_pin) as source, \
                os.fdopen(fd, "wb") as target:
            shutil.copyfileobj(source, target, 1024 * 1024)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return path


def parquet_cache_purge(*, job_id: uuid.UUID) -> None:
    """Remove a job's downloaded input from this machine's cache (its data purge)."""
    shutil.rmtree(PARQUET_CACHE / str(job_id), ignore_errors=True)


def parquet_cache_prune(*, keep: uuid.UUID | None = None) -> None:
    """Drop the cached inputs of jobs that have ended (or are gone), then the least
    recently read ones while the cache is over PARQUET_CACHE_MAX_BYTES; `keep` is the job
    being read now."""
    if not PARQUET_CACHE.is_dir():
        return
    folders: dict[uuid.UUID, Path] = {}
    for folder in PARQUET_CACHE.iterdir():
        try:
            folders[uuid.UUID(folder.name)] = folder
        except ValueError:  # a file of the former layout (named by key), kept forever
            _remove(folder)
    running = set(Job.objects.filter(pk__in=list(folders))
                  .exclude(status__in=TERMINAL_STATUSES).values_list("pk", flat=True))
    sized: list[tuple[float, int, Path]] = []
    for job_id, folder in folders.items():
        if job_id not in running and job_id != keep:
            _remove(folder)
            continue
        sized.append((*_usage(folder), folder))
    total = sum(size for _, size, _ in sized)
    for _, size, folder in sorted(sized, key=lambda item: item[0]):
        if total <= PARQUET_CACHE_MAX_BYTES:
            break
        if folder.name != str(keep):
            shutil.rmtree(folder, ignore_errors=True)
            total -= size


def _usage(folder: Path) -> tuple[float, int]:
    """(last read, bytes) of a cache folder; another worker may be pruning it meanwhile."""
    last, size = 0.0, 0
    try:
        for entry in folder.iterdir():
            stat = entry.stat()
            last, size = max(last, stat.st_mtime), size + stat.st_size
    except OSError:
        pass
    return last, size


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def rows_read(job: Job, chunk: Chunk) -> list[InputRow]:
    """The chunk's rows, in input order (the file was validated while estimating); a
    grouped chunk's in its planned order, each with its own row index (_spans_read)."""
    assert job.input is not None
    if chunk.spans is not None:
        return _spans_read(job, chunk.spans)
    if job.format == InputFormat.JSONL:
        assert chunk.byte_start is not None and chunk.byte_end is not None
        data = storage_for(job.data_residency).read_range(
            job.input.object_key, chunk.byte_start, chunk.byte_end,
            pin=job.input.content_pin)  # the frozen bytes, or StorageChanged
        lines = range_rows(data, first=chunk.byte_start == 0)
        return [_jsonl_row(chunk.first_row + offset, line) for offset, line in enumerate(lines)]
    return _parquet_read(job, [(chunk.first_row, chunk.row_count)])


# A grouped chunk reads the bytes between two of its rows rather than make a second
# request, up to this gap: an S3 GET's wait is worth some hundreds of KB of transfer.
SPAN_GAP_BYTES = 256 * 1024
# And makes its reads this many at a time: the rows of a group lie apart in the file.
SPAN_READS = 8


def _spans_read(job: Job, spans: list[int]) -> list[InputRow]:
    """A grouped chunk's rows (Chunk.spans: flat [row index, byte start, byte end, ...]
    in planned order), in that order. Its rows are read in file order, ranges that touch
    or lie within SPAN_GAP_BYTES of each other read as one, SPAN_READS at a time, every
    read pinned to the frozen bytes as a contiguous chunk's is: the rows of a group mostly
    lie apart in the file, but a chunk's often near each other."""
    assert job.input is not None
    read = storage_for(job.data_residency).range_reader(job.input.object_key,
                                                        pin=job.input.content_pin)
    triples = [(spans[at], spans[at + 1], spans[at + 2]) for at in range(0, len(spans), 3)]
    reads: list[list[tuple[int, int, int]]] = []
    for triple in sorted(triples, key=lambda item: item[1]):
        if reads and triple[1] - reads[-1][-1][2] <= SPAN_GAP_BYTES:
            reads[-1].append(triple)
        else:
            reads.append([triple])

    def bytes_of(group: list[tuple[int, int, int]]) -> bytes:
        return read(group[0][1], max(end for *_, end in group))  # or StorageChanged

    if len(reads) > 1:
        with ThreadPoolExecutor(min(SPAN_READS, len(reads)), "span-read") as pool:
            datas = list(pool.map(bytes_of, reads))
    else:
        datas = [bytes_of(group) for group in reads]
    lines: dict[int, bytes] = {}
    for group, data in zip(reads, datas, strict=True):
        first = group[0][1]
        for index, start, end in group:
            lines[index] = line_row(data[start - first:end - first], first=start == 0)
    return [_jsonl_row(index, lines[index]) for index, _start, _end in triples]


def rows_at(job: Job, picks: list[list[int]]) -> list[InputRow]:
    """The rows `picks` names (Job.sample_rows: a JSONL row's index and byte range, a
    parquet row's index), each read alone, in the order given."""
    assert job.input is not None
    if job.format == InputFormat.JSONL:
        storage = storage_for(job.data_residency)
        return [_jsonl_row(index, line_row(storage.read_range(
                    job.input.object_key, start, end, pin=job.input.content_pin),
                    first=start == 0))
                for index, start, end in picks]
    return _parquet_read(job, [(index, 1) for index, *_ in picks])


def _jsonl_row(index: int, line: bytes) -> InputRow:
    request = line_loads(line)
    return InputRow(index, str(request["custom_id"]), request.get("body") or {})


def _parquet_read(job: Job, spans: list[tuple[int, int]]) -> list[InputRow]:
    """The rows of each (first row, count) span of a parquet input, span by span."""
    reading = kind_named(job.task_type).parquet
    assert reading is not None, "a parquet input was validated for a kind that reads it"
    parquet = parquet_open(input_parquet_path(job))
    content, identity = parquet_columns(parquet, reading)
    rows = []
    for first, count in spans:
        for row_index, name, value in parquet_rows(parquet, content, identity, start=first):
            if row_index >= first + count:
                break
            rows.append(InputRow(row_index, str(name if identity else row_index),
                                 reading.body(content, value)))
    return rows


def record(row: InputRow, served: ServedRow) -> dict[str, Any]:
    """One row's result as the chunk object keeps it; the result file is made from these."""
    return {"i": row.index, "id": row.ident, "outcome": served.outcome.value,
            "status_code": served.status_code, "body": served.body, "error": served.error,
            "output": served.output}
