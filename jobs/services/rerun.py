"""Re-runs (POST /jobs/{id}/rerun) and the merged result (GET /jobs/{id}/result?merged=true).

A re-run is a new job, the parent's child, whose input is exactly the parent's rows whose
outcome is one of `include` (default: error), byte for byte and in the parent's order, so
they keep their custom_ids. It is submitted through job_submit like any job (the request
answers it `submitted` at once; a worker derives its input, job_rerun_input): estimated,
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

import hashlib
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from anex.errors import Conflict, DomainError, Gone
from anex.regions import Region, region_check
from billing.services import credits_require_positive
from console.actors import Actor
from inference.constants import InputFormat, RowOutcome
from jobs import dispatch
from jobs.constants import TERMINAL_STATUSES, ChunkStatus, FailureCode, InputStatus, JobStatus
from jobs.jsonl import BOM, input_rows
from jobs.models import Input, Job
from jobs.results import records, records_costed, rows_write
from jobs.services.data import DELETED, RESULT_LINK_SECONDS, job_result_link
from jobs.services.inputs import INPUT_CHANGED, input_derived_create, input_refresh
from jobs.services.lifecycle import WORKER, job_fail
from jobs.services.purge import merged_key, merged_stamp_key
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
    counts them (jobs.jsonl.input_rows: a blank line is no row)."""
    assert job.input is not None
    picked = _picked(job, include)
    wanted = next(picked, None)
    with storage_for(job.data_residency).open(job.input.object_key,
                                              pin=job.input.content_pin) as stream:
        for index, (_start, _end, line) in enumerate(input_rows(stream)):
            if wanted is None:
                break
            if index == wanted:
                if index == 0:
                    line = line.removeprefix(BOM)
                yield line if line.endswith(b"\n") else line + b"\n"
                wanted = next(picked, None)


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
    returns it, `submitted`, and how many rows it takes. Its input is derived from the
    parent's rows by job_rerun_input on a worker: the request reads none of them, so a
    re-run of a 2 GiB job answers as fast as one of 2 rows."""
    count = _rerunnable(job, include)
    # The cheap refusals a submit would make, before anything is written: 402, then 421.
    credits_require_positive(organization=job.organization)
    region_check(host_region=host_region, residency=job.data_residency, noun="job")
    assert job.input is not None  # _rerunnable: the parent's input is ready
    child = job_submit(
        organization=job.organization, actor=actor, host_region=host_region, parent=job,
        rerun_include=include,
        request=JobRequest(options=job.options(), input_id=str(job.input.pk),
                           data_residency=job.data_residency, priority=job.priority))
    return child, count


class _Taken(Exception):
    """The child was cancelled, or another run of the task derived its input first."""


def job_rerun_input(*, job_id: uuid.UUID | str) -> Input | None:
    """The job_rerun_input_task actor's work: write the child's input from its parent's
    picked rows, then send its estimate. Safe to run twice: the input is attached by a
    guarded update, and a run that loses (or finds the child cancelled) removes its own
    copy. A parent whose data or input went in the meantime fails the child unbilled."""
    child = Job.objects.select_related("parent__input", "organization",
                                       "created_by_key").get(pk=job_id)
    parent = child.parent
    if parent is None or child.input_id is not None or child.status != JobStatus.SUBMITTED:
        return None
    include = list(child.rerun_include or DEFAULT_INCLUDE)
    actor = Actor(key=child.created_by_key) if child.created_by_key is not None else WORKER
    item: Input | None = None
    try:
        _rerunnable(parent, include)
        rows = _jsonl_lines(parent, include) if parent.format == InputFormat.JSONL \
            else _parquet_bytes(parent, include)
        with transaction.atomic():
            item = input_derived_create(
                organization=child.organization, actor=actor, fmt=InputFormat(parent.format),
                residency=Region(parent.data_residency), chunks=rows, mode="rerun")
            if Job.objects.filter(pk=child.pk, status=JobStatus.SUBMITTED,
                                  input__isnull=True).update(input=item) != 1:
                raise _Taken
            dispatch.send_on_commit("job_estimate_task", str(child.pk))
        return item
    except _Taken:
        _discard(item)
        return None
    except (StorageChanged, DomainError) as error:
        _discard(item)  # its row rolled back: the object it names goes too
        reason = INPUT_CHANGED if isinstance(error, StorageChanged) else error.detail
        job_fail(job=child, code=FailureCode.INVALID_INPUT, reason=reason)
        return None
    except BaseException:
        _discard(item)
        raise


def _discard(item: Input | None) -> None:
    """Remove the object of a derived input whose row did not commit."""
    if item is not None:
        storage_for(item.data_residency).delete(item.object_key)


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


def _merged_stamp(job: Job) -> str:
    """What the merged file is made of: every finished re-run below the job (with its
    result) in merge order. Any change to it (a re-run finishing, one's data deleted)
    changes the stamp."""
    def walk(parent: Job) -> Iterator[str]:
        for child in _children(parent):
            yield f"{child.pk}:{child.result_key}"
            yield from walk(child)
    return hashlib.sha256("\n".join(walk(job)).encode()).hexdigest()


def job_result_merged_link(*, job: Job) -> dict[str, object]:
    """GET /jobs/{id}/result?merged=true: one file with every delivered row's latest
    outcome; the plain result when the job has no finished re-run. The file is written
    once per set of finished re-runs (its stamp beside it) and served from there: a poll
    of ?merged=true does not read and rewrite every row each time, and concurrent first
    requests write it once (_merged_write_once)."""
    link = job_result_link(job=job)  # 410, 409 as the plain result answers
    if not _children(job):
        return {**link, "merged": True}
    stamp = _merged_stamp(job)
    count = _stamped_count(job, stamp)
    if count is None:
        count = _merged_write_once(job, stamp)
    url = storage_for(job.data_residency).download_url(
        merged_key(job), expires_in=RESULT_LINK_SECONDS,
        filename=f"{job.pk}-merged.{job.format}")
    return {**link, "result_url": url, "row_count": count, "merged": True}


# A merge's claim (Job.merge_claimed_at) is renewed every MERGE_BEAT_SECONDS while its rows
# go by; one not renewed for MERGE_CLAIM_STALE belongs to a request that died, and is taken
# over. A request waiting on another's merge looks at the claim every MERGE_POLL_SECONDS.
MERGE_BEAT_SECONDS = 10.0
MERGE_CLAIM_STALE = timedelta(seconds=120)
MERGE_POLL_SECONDS = 0.25


def _merge_claim(job: Job) -> datetime | None:
    """Take the job's merge claim (free, or stale); its time, the claim's token, or None
    while another request holds it."""
    now = timezone.now()
    taken = Job.objects.filter(pk=job.pk).filter(
        Q(merge_claimed_at__isnull=True) | Q(merge_claimed_at__lte=now - MERGE_CLAIM_STALE)
    ).update(merge_claimed_at=now)
    return now if taken == 1 else None


def _merge_claimed(job: Job) -> bool:
    """Whether another request holds a live claim on the job's merge."""
    return Job.objects.filter(pk=job.pk, merge_claimed_at__gt=timezone.now()
                              - MERGE_CLAIM_STALE).exists()


def _beating(rows: Iterator[dict[str, Any]], job: Job,
             token: list[datetime]) -> Iterator[dict[str, Any]]:
    """The rows, the claim renewed as they go by (token[0]: the claim's time as written)."""
    due = time.monotonic() + MERGE_BEAT_SECONDS
    for row in rows:
        if time.monotonic() >= due:
            now = timezone.now()
            Job.objects.filter(pk=job.pk, merge_claimed_at=token[0]).update(
                merge_claimed_at=now)
            token[0], due = now, time.monotonic() + MERGE_BEAT_SECONDS
        yield row


def _merged_write_once(job: Job, stamp: str) -> int:
    """Write the merged file for `stamp` and its stamp; its row count. Concurrent first
    requests (issue 40 L12: each read every row of the job and its re-runs and wrote the
    same file) are told apart by the job's merge claim: the one that takes it writes, the
    others wait for the claim to go and serve what it wrote. A writer that died leaves a
    claim that stops beating, and a waiter takes it over; one that failed leaves no stamp,
    and a waiter writes the file itself."""
    storage = storage_for(job.data_residency)
    while True:
        claimed = _merge_claim(job)
        if claimed is not None:
            token = [claimed]
            try:
                # Written by the holder this request waited for, or just before its look.
                count = _stamped_count(job, stamp)
                if count is None:
                    count = rows_write(job, _beating(merged_records(job), job, token),
                                       merged_key(job))
                    # Written after the file, so a stamp never names a file not all there.
                    storage.write_stream(merged_stamp_key(job), [f"{stamp} {count}".encode()],
                                         max_bytes=1024)
                return count
            finally:
                Job.objects.filter(pk=job.pk, merge_claimed_at=token[0]).update(
                    merge_claimed_at=None)
        # Another request is writing it: as long as it beats, the wait is its write's.
        while _merge_claimed(job):
            time.sleep(MERGE_POLL_SECONDS)
        count = _stamped_count(job, stamp)
        if count is not None:
            return count


def _stamped_count(job: Job, stamp: str) -> int | None:
    """The row count of the merged file already written for this stamp, or None."""
    storage = storage_for(job.data_residency)
    if not storage.exists(merged_stamp_key(job)) or not storage.exists(merged_key(job)):
        return None
    written, _, count = storage.read_head(merged_stamp_key(job), 1024).decode().partition(" ")
    return int(count) if written == stamp and count.isdigit() else None
