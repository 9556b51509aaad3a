"""GET /jobs/{id}/rows: a job's finished rows, a page at a time, while it runs and after it
(issue 44; docs/dev/decisions/2026-12-06-rows-readable-while-running.md).

A page is the result lines after line `after` (a cursor: the last line already read, 0 at
the start), up to `limit` of them, and the cursor to ask from next. Lines are numbered as
in the result file. While a job runs every input row gets a line (jobs.services.rows:
each row of a chunk is recorded, whatever its outcome), so line n is row n - 1, and the
lines readable are those of the rows before the first row of any chunk not done (the
readable end): a chunk's rows finish together, and a chunk done further on is counted in
Anex-Rows-Ahead until the rows before it are. A running page's lines are the result
file's lines without their cost member, which only the price at the end can give
(jobs.results._enveloped, the merge's own writer, so the final line is the running line
with `,"cost":{...}` before its closing brace). Once the job has ended with a result, a
JSONL page is the result file's lines, byte for byte; a parquet job's pages are its
delivered rows' JSONL envelopes as while it ran (the chunks' results, kept until the job's
data is deleted), numbered in the same way (the parquet file's row order).

A page reads at most PAGE_CHUNKS chunk results, so what one request costs is bounded
however a grouped plan spreads its rows over chunks (jobs.validation.grouping): a page
that reached the bound is shorter, and its cursor says exactly where it ended.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from django.db import connection

from anex.errors import Conflict, Gone
from inference.constants import InputFormat
from jobs.constants import TERMINAL_STATUSES, ChunkStatus
from jobs.models import Chunk, Job
from jobs.results import (
    LINE_MARK_EVERY,
    chunk_key,
    chunk_result_lines,
    line_uncosted,
    rows_in_order,
)
from jobs.selectors import ROWS_RUNNING, SPAN_ROWS, job_done_rows, job_grouped, readable_end
from jobs.services.data import DELETED, NOTHING_DELIVERED
from jobs.storage import storage_for

ROWS_LIMIT_DEFAULT = 1000
ROWS_LIMIT_MAX = 10_000
# Chunk results one page reads at most.
PAGE_CHUNKS = 64
NO_ROW_YET = "This job is {status}: no row has finished yet."


@dataclass(frozen=True)
class RowsPage:
    """A page: its lines (each ending in its newline, produced as the response is sent),
    the cursor after its last line, and the finished rows past that cursor."""

    lines: Iterator[bytes]
    next_after: int
    ahead: int


def job_rows_page(*, job: Job, after: int, limit: int) -> RowsPage:
    """The lines after line `after`, at most `limit`; or why there are none to read."""
    if job.data_deleted_at is not None:
        raise Gone(DELETED)
    if job.status in TERMINAL_STATUSES:
        if not job.result_key:
            raise Conflict(NOTHING_DELIVERED.format(status=job.status))
        if job.format == InputFormat.JSONL:
            return _file_page(job, after=after, limit=limit)
        return _chunks_page(job, after=after, limit=limit, end=None)
    if job.status not in ROWS_RUNNING or not job_done_rows(job):
        raise Conflict(NO_ROW_YET.format(status=job.status))
    return _chunks_page(job, after=after, limit=limit, end=readable_end(job))


def _file_page(job: Job, *, after: int, limit: int) -> RowsPage:
    """A finished JSONL job's page: its result file's lines, as written, read from the
    line mark before the page (Job.result_line_marks)."""
    delivered = job_done_rows(job)
    last = max(after, min(after + limit, delivered))

    def lines() -> Iterator[bytes]:
        if last == after:
            return
        # From the nearest line mark at or before line after + 1 (a job finished before
        # the marks were written: from the start).
        marks = job.result_line_marks or []
        mark = min(after // LINE_MARK_EVERY, len(marks))
        start = marks[mark - 1] if mark else 0
        with storage_for(job.data_residency).open_at(job.result_key, start) as stream:
            number = mark * LINE_MARK_EVERY
            for line in stream:
                if not line.strip():
                    continue
                number += 1
                if number > after:
                    yield line if line.endswith(b"\n") else line + b"\n"
                    if number == last:
                        return

    return RowsPage(lines(), last, delivered - last)


def _chunks_page(job: Job, *, after: int, limit: int, end: int | None) -> RowsPage:
    """A page from the done chunks' results: their rows in row order, numbered 1 on, up to
    the row `end` (a running job's readable end; None: every done row)."""
    done = job_done_rows(job)
    stop = min(after + limit, done if end is None else min(end, done))
    if stop <= after:
        return RowsPage(iter(()), after, max(done - after, 0))
    if job_grouped(job):
        return _grouped_page(job, after=after, stop=stop, done=done, running=end is not None)
    return _contiguous_page(job, after=after, stop=stop, done=done)


def _contiguous_page(job: Job, *, after: int, stop: int, done: int) -> RowsPage:
    """Lines after..stop of a contiguous plan: its done chunks in row order, each a run of
    consecutive lines (the k-th line of a chunk is its k-th row)."""
    picked: list[tuple[int, int, int]] = []  # chunk index, first and end line within it
    line = 0
    for index, count in Chunk.objects.filter(job_id=job.pk, status=ChunkStatus.DONE) \
            .order_by("first_row").values_list("index", "row_count"):
        first, line = line, line + count
        if line <= after:
            continue
        if first >= stop:
            break
        if len(picked) == PAGE_CHUNKS:
            stop = first
            break
        picked.append((index, max(after - first, 0), min(stop, line) - first))

    def lines() -> Iterator[bytes]:
        results = storage_for(job.data_residency).read_each(
            (chunk_key(job, index) for index, _, _ in picked), ahead=2)
        for (_, skip, take), data in zip(picked, results, strict=True):
            for row in itertools.islice(chunk_result_lines(data), skip, take):
                yield line_uncosted(row)

    return RowsPage(lines(), stop, done - stop)


def _grouped_page(job: Job, *, after: int, stop: int, done: int, running: bool) -> RowsPage:
    """Lines after..stop of a grouped plan, whose chunks hold rows spread over the file:
    the rows and their chunks found in the chunks' spans, in row order (while the job
    runs the row with line n is row n - 1; once it has ended, the n-th delivered row), cut
    before the first row of a chunk past PAGE_CHUNKS."""
    # The table's name and SPAN_ROWS are the code's; the values are parameters.
    query = (f"SELECT s.row_index, c.index FROM {Chunk._meta.db_table} c {SPAN_ROWS} "  # noqa: S608
             "AND c.status = %s")
    if running:
        query += " AND s.row_index >= %s AND s.row_index < %s ORDER BY s.row_index"
        params: list[str | int] = [str(job.pk), ChunkStatus.DONE, after, stop]
    else:
        query += " ORDER BY s.row_index OFFSET %s LIMIT %s"
        params = [str(job.pk), ChunkStatus.DONE, after, stop - after]
    with connection.cursor() as cursor:
        cursor.execute(query, params)
        found = cursor.fetchall()
    chunks: set[int] = set()
    rows: set[int] = set()
    for row, index in found:
        if index not in chunks:
            if len(chunks) == PAGE_CHUNKS:
                break
            chunks.add(index)
        rows.add(row)
    stop = after + len(rows)

    def lines() -> Iterator[bytes]:
        for row, line in rows_in_order(job, [Chunk(job_id=job.pk, index=index)
                                            for index in sorted(chunks)]):
            if row in rows:
                yield line_uncosted(line)

    return RowsPage(lines(), stop, done - stop)
