"""A job's rows by how they ended, for the console's picture of a job (issue 44;
docs/dev/decisions/2026-12-06-the-job-as-a-picture.md). Reads only, of a job already read
through its organization's scope (jobs.selectors.job_get), and the one writer's helper:

- error_key and error_codes_count: the key a failed row is counted under (its error's type,
  with its code when it has one) and a chunk's counts by it, which the move to done records
  (Chunk.error_codes, jobs.services.chunks.chunk_complete);
- job_outcomes: the breakdown, summed over the job's chunks in the database;
- job_error_rows: one error's rows, a page at a time, read from the results of only the
  chunks that recorded it;
- job_timeline: finished and failed rows over time, from the done chunks' finish times.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, overload

from django.db import connection
from django.db.models import F, FloatField, Func, Max, Q, Sum
from django.db.models.functions import Floor
from django.utils import timezone

from jobs.constants import ChunkStatus
from jobs.jsonl import line_loads
from jobs.models import Chunk, Job
from jobs.results import chunk_key
from jobs.storage import storage_for

# An error's key is a label on a page and a query parameter: a code past this is cut.
KEY_MAX = 100


def error_key(error: dict[str, Any]) -> str:
    """What a failed row is counted under: its error's type (output-format.txt's
    error.type), and its code after a colon when it has one (a media_fetch_error's is the
    remote host's HTTP status: "media_fetch_error:429")."""
    kind = str(error.get("type") or "error")
    code = error.get("code")
    return (kind if code is None or code == "" else f"{kind}:{code}")[:KEY_MAX]


def error_codes_count(results: Iterable[dict[str, Any]]) -> dict[str, int]:
    """A chunk's failed rows (those with an error object) by error_key."""
    return dict(Counter(error_key(row["error"]) for row in results if row.get("error")))


# --- the breakdown ----------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorCount:
    key: str
    rows: int

    @property
    def type(self) -> str:
        return self.key.partition(":")[0]

    @property
    def code(self) -> str:
        return self.key.partition(":")[2]


@dataclass(frozen=True)
class Outcomes:
    """The job's rows so far: those its done chunks ran, by outcome (each error by its
    key), those that will not run (their chunk failed or was skipped), and those still
    to run. `unrecorded`: failed rows of chunks done before their errors were counted by
    key (Chunk.error_codes empty), shown without a link."""

    total: int
    succeeded: int
    truncated: int
    errors: list[ErrorCount]
    unrecorded: int
    not_run: int

    @property
    def failed(self) -> int:
        return sum(error.rows for error in self.errors) + self.unrecorded

    @property
    def waiting(self) -> int:
        return max(self.total - self.succeeded - self.truncated - self.failed - self.not_run, 0)


def _error_codes_summed(job: Job) -> dict[str, int]:
    """Chunk.error_codes added up over the job's done chunks, in the database."""
    table = Chunk._meta.db_table  # the model's own, never a caller's
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT codes.key, SUM(codes.value::bigint) FROM {table} AS chunk, "  # noqa: S608
            "jsonb_each_text(chunk.error_codes) AS codes "
            "WHERE chunk.job_id = %s AND chunk.status = %s GROUP BY codes.key",
            [job.pk, ChunkStatus.DONE.value])
        return {key: int(rows) for key, rows in cursor.fetchall()}


def job_outcomes(*, job: Job) -> Outcomes:
    done = Q(status=ChunkStatus.DONE)
    sums = Chunk.objects.filter(job_id=job.pk).aggregate(
        planned=Sum("row_count"), success=Sum("success_rows", filter=done),
        truncated=Sum("truncated_rows", filter=done), errors=Sum("error_rows", filter=done),
        format_errors=Sum("format_error_rows", filter=done),
        not_run=Sum("row_count", filter=Q(status__in=[ChunkStatus.FAILED,
                                                       ChunkStatus.SKIPPED])))
    codes = _error_codes_summed(job)
    failed = (sums["errors"] or 0) + (sums["format_errors"] or 0)
    errors = sorted((ErrorCount(key=key, rows=rows) for key, rows in codes.items() if rows),
                    key=lambda error: (-error.rows, error.key))
    total = job.row_count if job.row_count is not None else sums["planned"] or 0
    return Outcomes(total=total, succeeded=sums["success"] or 0,
                    truncated=sums["truncated"] or 0, errors=errors,
                    unrecorded=max(failed - sum(codes.values()), 0),
                    not_run=sums["not_run"] or 0)


# --- one error's rows -------------------------------------------------------------------


@dataclass(frozen=True)
class ErrorRow:
    row_index: int
    custom_id: str
    message: str
    param: str | None


class ErrorRows(Sequence[ErrorRow]):
    """One error's rows of a job, in chunk order (and row order within a chunk), as a
    sequence a Paginator pages: its length is the chunks' recorded counts, and a page reads
    the results of only the chunks it falls in (the counts say which), never the rest."""

    def __init__(self, job: Job, key: str) -> None:
        self.job = job
        self.key = key
        self.chunks = [(index, int(codes[key])) for index, codes in
                       Chunk.objects.filter(job_id=job.pk, status=ChunkStatus.DONE,
                                            error_codes__has_key=key)
                       .order_by("index").values_list("index", "error_codes")]

    def __len__(self) -> int:
        return sum(rows for _index, rows in self.chunks)

    @overload
    def __getitem__(self, item: int) -> ErrorRow: ...

    @overload
    def __getitem__(self, item: slice) -> list[ErrorRow]: ...

    def __getitem__(self, item: int | slice) -> ErrorRow | list[ErrorRow]:
        if isinstance(item, int):
            return self[item:item + 1][0]
        start, stop, _ = item.indices(len(self))
        return list(self._between(start, stop))

    def _between(self, start: int, stop: int) -> Iterator[ErrorRow]:
        first = 0  # the place of the chunk's first row of this error among all of them
        for index, rows in self.chunks:
            if first >= stop:
                return
            if first + rows > start:
                found = self._read(index)
                yield from found[max(start - first, 0):stop - first]
            first += rows

    def _read(self, index: int) -> list[ErrorRow]:
        found = []
        with storage_for(self.job.data_residency).open(chunk_key(self.job, index)) as lines:
            for line in lines:
                if not line.strip():
                    continue
                row = line_loads(line)
                error = row.get("error")
                if error and error_key(error) == self.key:
                    found.append(ErrorRow(row_index=row["i"], custom_id=str(row["id"]),
                                          message=str(error.get("message") or ""),
                                          param=error.get("param")))
        # A grouped plan's chunk keeps its rows in the order they ran (jobs.results).
        return sorted(found, key=lambda row: row.row_index)


def job_error_rows(*, job: Job, key: str) -> ErrorRows:
    return ErrorRows(job, key)


# --- rows over time ---------------------------------------------------------------------


@dataclass(frozen=True)
class TimePoint:
    """Rows finished (succeeded or truncated) and failed by `at`, counted together."""

    at: datetime
    finished: int
    failed: int


class _Epoch(Func):
    template = "EXTRACT(EPOCH FROM %(expressions)s)"
    output_field = FloatField()


# The most points a timeline has: a job of a million rows has thousands of chunks, and a
# page that polls every two seconds reads them grouped into this many spans of time.
TIMELINE_POINTS = 120


def job_timeline(*, job: Job, until: datetime | None = None) -> list[TimePoint]:
    """The cumulative rows of the job's done chunks at each chunk's finish (chunks that
    finished within one span of time, of TIMELINE_POINTS from approval to `until`, are
    one point, at the last finish of them), oldest first. Empty before approval."""
    if job.approved_at is None:
        return []
    start = job.approved_at
    end = until or job.finished_at or timezone.now()
    width = max((end - start).total_seconds() / TIMELINE_POINTS, 0.001)
    spans = (Chunk.objects.filter(job_id=job.pk, status=ChunkStatus.DONE,
                                  finished_at__isnull=False)
             .annotate(span=Floor((_Epoch(F("finished_at")) - start.timestamp()) / width))
             .values("span")
             .annotate(at=Max("finished_at"),
                       finished=Sum(F("success_rows") + F("truncated_rows")),
                       failed=Sum(F("error_rows") + F("format_error_rows")))
             .order_by("span"))
    points, finished, failed = [], 0, 0
    for span in spans:
        finished += span["finished"] or 0
        failed += span["failed"] or 0
        points.append(TimePoint(at=max(span["at"], start), finished=finished, failed=failed))
    return points

