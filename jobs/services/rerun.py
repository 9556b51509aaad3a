"""Re-runs (POST /jobs/{id}/rerun) and the merged result (GET /jobs/{id}/result?merged=true).

A re-run is a new job, the parent's child, whose input is exactly the parent's rows whose
outcome is one of `include` (default: error), byte for byte and in the parent's order, so
they keep their custom_ids. It is submitted through job_submit like any job: estimated,
approved (or auto-approved), run, charged and sent webhooks on its own; a row that
succeeded in the parent is never run or billed again.

Nothing maps a child's row back to its parent's but that order: the child's row k is the
k-th parent row (in input order) whose own outcome was in the child's rerun_include. The
merged result walks the parent's delivered rows once and, for each, takes the outcome of
the latest child that delivered it (children in creation order, a child's own re-runs
merged into it first), so each row appears once with its latest outcome and its own cost.
Every read is a stream: no file, and no list of rows, is held in memory.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from typing import Any

from django.db import transaction

from anex.errors import Conflict, Gone
from anex.regions import Region, region_check
from billing.services import credits_require_positive
from console.actors import Actor
from inference.constants import InputFormat, RowOutcome
from jobs.constants import TERMINAL_STATUSES, ChunkStatus, InputStatus
from jobs.models import Input, Job
from jobs.results import records, records_costed, rows_write
from jobs.services.data import DELETED, RESULT_LINK_SECONDS, job_result_link
from jobs.services.inputs import INPUT_CHANGED, input_derived_create, input_refresh
from jobs.services.purge import merged_key
from jobs.services.rows import input_parquet_path
from jobs.services.submission import JobRequest, job_submit
from jobs.storage import StorageChanged, storage_for

DEFAULT_INCLUDE = [RowOutcome.ERROR.value]
# The job's count of rows with each outcome a re-run may pick.
_COUNTS = {RowOutcome.ERROR: "error_rows", RowOutcome.TRUNCATED: "truncated_rows",
           RowOutcome.FORMAT_ERROR: "format_error_rows"}
INPUT_GONE = ("This job's input file has expired (an input is kept 7 days) or was deleted, "
              "so its rows cannot be run again: submit a new job with the rows instead.")


def _done_chunks(job: Job) -> list[Any]:
    return list(job.chunks.filter(status=ChunkStatus.DONE).order_by("index"))


def _picked(job: Job, include: list[str]) -> Iterator[int]:
    """The indices of the job's delivered rows whose outcome is in `include`, in order."""
    wanted = set(include)
    for row in records(job, _done_chunks(job)):
        if row["outcome"] in wanted:
            yield int(row["i"])


def _jsonl_lines(job: Job, include: list[str]) -> Iterator[bytes]:
    """The picked rows' request lines, as the input has them. Rows are counted as the run
    planned them (jobs.services.running.chunks_plan: every non-blank line is a row)."""
    assert job.input is not None
    picked = _picked(job, include)
    wanted = next(picked, None)
    index = 0
    with storage_for(job.data_residency).open(job.input.object_key,
                                              pin=job.input.content_pin) as stream:
        for line in stream:
            if wanted is None:
                break
            if not line.strip():
                continue
            if index == wanted:
                if index == 0:
                    line = line.removeprefix(b"\xef\xbb\xbf")
                yield line if line.endswith(b"\n") else line + b"\n"
                wanted = next(picked, None)
            index += 1


def _parquet_bytes(job: Job, include: list[str]) -> Iterator[bytes]:
    """The picked rows as a parquet file with the input's own columns (spooled to disk)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = pq.ParquetFile(input_parquet_path(job))
    picked = _picked(job, include)
    wanted = next(picked, None)
    first = 0
    with tempfile.NamedTemporaryFile(suffix=".parquet") as local:
        with pq.ParquetWriter(local.name, source.schema_arrow) as writer:
            for batch in source.iter_batches(batch_size=4096):
                take = []
                while wanted is not None and wanted < first + batch.num_rows:
                    take.append(wanted - first)
                    wanted = next(picked, None)
                if take:
                    writer.write_table(pa.Table.from_batches([batch]).take(take))
                first += batch.num_rows
                if wanted is None:
                    break
        with open(local.name, "rb") as written:
            yield from iter(lambda: written.read(1024 * 1024), b"")


def _rerunnable(job: Job, include: list[str]) -> int:
    """How many rows the re-run takes; 409/410 when there is nothing it can run."""
    if job.status not in TERMINAL_STATUSES:
        raise Conflict(f"This job is {job.status}: only a finished job (done, failed or "
                       "cancelled) can have its rows run again.")
    if job.data_deleted_at is not None:
        raise Gone(DELETED)
    count = sum(getattr(job, _COUNTS[RowOutcome(outcome)]) or 0 for outcome in include)
    if not job.result_key or not count:
        raise Conflict(f"This job has no rows whose outcome is {' or '.join(include)}: "
                       "there is nothing to run again.")
    item = input_refresh(item=job.input) if job.input is not None else None
    if item is None or item.status != InputStatus.READY or item.deleted_at is not None:
        raise Gone(INPUT_GONE)
    return count


def job_rerun(*, job: Job, actor: Actor, include: list[str],
              host_region: Region) -> tuple[Job, int]:
    """Create the child job that runs `job`'s rows whose outcome is in `include` again;
    returns it and how many rows it takes."""
    count = _rerunnable(job, include)
    # The cheap refusals a submit would make, before any row is read: 402, then 421.
    credits_require_positive(organization=job.organization)
    region_check(host_region=host_region, residency=job.data_residency, noun="job")
    rows = _jsonl_lines(job, include) if job.format == InputFormat.JSONL \
        else _parquet_bytes(job, include)
    item: Input | None = None
    try:
        with transaction.atomic():
            item = input_derived_create(
                organization=job.organization, actor=actor, fmt=InputFormat(job.format),
                residency=Region(job.data_residency), chunks=rows, mode="rerun")
            child = job_submit(
                organization=job.organization, actor=actor, host_region=host_region,
                parent=job, rerun_include=include,
                request=JobRequest(options=job.options(), input_id=str(item.pk),
                                   data_residency=job.data_residency))
    except StorageChanged:
        raise Conflict(INPUT_CHANGED) from None
    except BaseException:
        if item is not None:  # its row rolled back: the object it names goes too
            storage_for(job.data_residency).delete(item.object_key)
        raise
    return child, count


# --- the merged result ------------------------------------------------------------------


class _Cursor:
    """A child's merged records, taken by the index of the row in the child's input."""

    def __init__(self, rows: Iterator[dict[str, Any]]) -> None:
        self.rows = rows
        self.current = next(rows, None)

    def take(self, index: int) -> dict[str, Any] | None:
        while self.current is not None and int(self.current["i"]) < index:
            self.current = next(self.rows, None)
        if self.current is not None and int(self.current["i"]) == index:
            return self.current
        return None  # the child did not deliver that row (it stopped early)


def _children(job: Job) -> list[Job]:
    """The re-runs whose rows can be merged: finished, with a result still kept."""
    return list(job.children.filter(status__in=TERMINAL_STATUSES, data_deleted_at__isnull=True)
                .exclude(result_key="").order_by("created_at", "id"))


def merged_records(job: Job) -> Iterator[dict[str, Any]]:
    """The job's delivered rows, each replaced by the latest outcome a re-run delivered
    for it, with the cost it was charged where that outcome was produced."""
    own = records_costed(job, _done_chunks(job), charge=job.cost_cents or 0)
    children = [(frozenset(child.rerun_include or DEFAULT_INCLUDE),
                 _Cursor(merged_records(child))) for child in _children(job)]
    taken = [0] * len(children)
    for row in own:
        latest = row
        for n, (include, cursor) in enumerate(children):
            if row["outcome"] not in include:
                continue
            replacement = cursor.take(taken[n])
            taken[n] += 1
            if replacement is not None:
                latest = {**replacement, "i": row["i"]}
        yield latest


def job_result_merged_link(*, job: Job) -> dict[str, object]:
    """GET /jobs/{id}/result?merged=true: one file with every delivered row's latest
    outcome, written now (a later re-run changes it); the plain result when the job has no
    finished re-run."""
    link = job_result_link(job=job)  # 410, 409 as the plain result answers
    if not _children(job):
        return {**link, "merged": True}
    key = merged_key(job)
    count = rows_write(job, merged_records(job), key)
    url = storage_for(job.data_residency).download_url(
        key, expires_in=RESULT_LINK_SECONDS, filename=f"{job.pk}-merged.{job.format}")
    return {**link, "result_url": url, "row_count": count, "merged": True}
