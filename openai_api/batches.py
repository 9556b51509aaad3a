"""OpenAI's batches over anex's jobs: one thin layer (docs/openai.md).

A batch is created at once: its file's first row names the model (OpenAI's rows carry
it), and the job is submitted through jobs.services.submission like any other, with the
policy OpenAI's batches have (Job): its rows must all name that model (row_model), every
failing row is kept (collect_row_errors), and it has no approval step
(approve_at_estimate). The batch's status, counts, times and usage are read from the job
each time; its output and error files are the job's one ordered result file, split by
each row's `error` (jobs.results result_lines). The rules are the job machinery's, called
from here: the input's format check, a line's cap, the usage a job is charged on.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from anex.errors import DomainError, Invalid, Malformed, NotFound, PaymentRequired
from anex.internals.prepared import PreparedSelect
from anex.regions import Region
from console.actors import Actor
from console.models import Organization
from inference.catalog import CatalogModel, catalog_limits, model_get
from inference.kinds import kind_for
from inference.rows.core import JobOptions, line_max_bytes
from jobs.constants import TERMINAL_STATUSES, FailureCode, InputStatus, JobStatus, Priority
from jobs.jsonl_scan import lines_body_model
from jobs.models import Job, JobEvent
from jobs.results import result_lines
from jobs.services.inputs import EMPTY_FILE, input_format_problem
from jobs.services.lifecycle import job_cancel
from jobs.services.metering import job_usage_recorded
from jobs.services.purge import input_data_purge
from jobs.services.submission import JobRequest, job_submit
from jobs.storage import StorageChanged, storage_for
from jobs.validation.lines import line_limit, line_too_long
from openai_api.models import FilePart, FilePurpose, OpenAIBatch, OpenAIFile

WINDOW = timedelta(hours=24)
# The completion windows a batch may ask for, and the urgency tier each maps to
# (docs/openai.md, "Completion windows and priority"): OpenAI's 24h is standard; 72h is
# anex's flex tier (half price, run on spare capacity). metadata {"anex_priority": ...}
# names the tier outright, over the window's.
COMPLETION_WINDOWS: dict[str, timedelta] = {"24h": WINDOW, "72h": timedelta(hours=72)}
WINDOW_TIER: dict[str, Priority] = {"24h": Priority.STANDARD, "72h": Priority.FLEX}
PRIORITY_METADATA = "anex_priority"
COMPLETION_WINDOW_INVALID = ("completion_window must be '24h' or '72h' (72h: the flex tier, "
                             "half price; docs/openai.md).")
ENDPOINTS = ("/v1/chat/completions", "/v1/embeddings", "/v1/systemone")
METADATA_PAIRS, METADATA_KEY_CHARS, METADATA_VALUE_CHARS = 16, 64, 512
# How far into the file its model is looked for: the first line that names one, among the
# lines read whole within the first 64 MiB.
MODEL_SCAN_LINES = 100
MODEL_SCAN_BYTES = 64 * 1024 * 1024
NOT_FOUND = "No batch found with id '{id}'."

# The job's status as OpenAI's batch status (a job approved at its estimate passes
# through cost_ready at once).
STATUS = {
    JobStatus.SUBMITTED: "validating", JobStatus.ESTIMATING: "validating",
    JobStatus.COST_READY: "validating", JobStatus.IN_PROGRESS: "in_progress",
    JobStatus.CANCELLING: "cancelling", JobStatus.FINALIZING: "finalizing",
    JobStatus.DONE: "completed", JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}
# A job cancelled for want of an approval it cannot get failed, as OpenAI counts it.
NOT_RUN = (FailureCode.INSUFFICIENT_CREDITS, FailureCode.NOT_APPROVED)


def _epoch(at: datetime | None) -> int | None:
    return int(at.timestamp()) if at is not None else None


# The batch with its job and input file, by organization and id: what the SDK's poll
# (client.batches.retrieve, in a loop) reads first, compiled once (anex.internals.prepared).
_BATCH_GET = PreparedSelect(
    lambda organization_id, id: OpenAIBatch.objects.select_related("job", "input_file")
    .filter(organization_id=organization_id, pk=id).order_by(),
    sentinels=(uuid.UUID(int=1), "batch_sentinel"))


def batch_get(*, organization: Organization, id: str) -> OpenAIBatch:
    batch = _BATCH_GET.first(organization.pk, id)
    if batch is None:
        raise NotFound(NOT_FOUND.format(id=id))
    return batch


def batch_status(batch: OpenAIBatch) -> str:
    job = batch.job
    if job is None:
        return "failed"
    if batch.expired_at is not None and job.status not in (JobStatus.DONE, JobStatus.FAILED):
        # Its job was cancelled past the window: the rows running finish first.
        return "expired" if job.status == JobStatus.CANCELLED else "finalizing"
    status = STATUS[JobStatus(job.status)]
    if job.status == JobStatus.CANCELLED and job.failure_code in NOT_RUN:
        return "failed"
    if job.cancel_requested and status in ("validating", "finalizing"):
        return "cancelling"
    return status


def batch_errors(batch: OpenAIBatch) -> list[dict[str, Any]] | None:
    """errors.data: why the batch failed before it ran (OpenAI's BatchError shape)."""
    if batch.errors is not None:
        return list(batch.errors)
    job = batch.job
    if job is None:
        return None
    if job.status == JobStatus.CANCELLED and job.failure_code == FailureCode.INSUFFICIENT_CREDITS:
        return [{"code": "insufficient_credits", "line": None, "param": None,
                 "message": f"The batch needs {job.est_cost_cents} credits held to run. "
                            f"{job.failure_reason}"}]
    if job.status == JobStatus.CANCELLED and job.failure_code == FailureCode.NOT_APPROVED:
        return [{"code": "not_approved", "line": None, "param": None,
                 "message": job.failure_reason}]
    if job.status == JobStatus.FAILED:
        if job.input_errors:
            return [{"code": error.get("code") or "invalid_request", "line": error.get("line"),
                     "param": None, "message": error["message"]}
                    for error in job.input_errors]
        return [{"code": job.failure_code or "failed", "line": None, "param": None,
                 "message": job.failure_reason}]
    return None


def _event_at(job: Job, status: JobStatus) -> datetime | None:
    event = JobEvent.objects.filter(job=job, to_status=status).order_by("id").first()
    return event.at if event is not None else None


def _usage(job: Job) -> dict[str, Any]:
    """What the finished chunks used: the usage the job is charged on (jobs.services.metering,
    as recorded when the job ended: no chunk is read then), in OpenAI's shape - input with
    media (Usage.all_input_tokens), of which the rows' cached tokens (reported, billed at
    the input rate), output with thinking (the chunks keep no separate count of thinking
    tokens)."""
    usage = job_usage_recorded(job=job)
    input_tokens = usage.all_input_tokens
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": usage.cached_input_tokens},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + usage.output_tokens}


def batch_object(batch: OpenAIBatch) -> dict[str, Any]:
    """The batch exactly as OpenAI's Batch object, plus anex_job_id."""
    job, status = batch.job, batch_status(batch)
    errors = batch_errors(batch)
    out: dict[str, Any] = {
        "id": batch.id, "object": "batch", "endpoint": batch.endpoint,
        "errors": {"object": "list", "data": errors} if errors else None,
        "input_file_id": batch.input_file_id, "completion_window": batch.completion_window,
        "status": status, "output_file_id": None, "error_file_id": None,
        "created_at": _epoch(batch.created_at), "in_progress_at": None,
        "expires_at": _epoch(batch.created_at + batch_window(batch.completion_window)),
        "finalizing_at": None,
        "completed_at": None, "failed_at": _epoch(batch.failed_at), "expired_at": None,
        "cancelling_at": _epoch(batch.cancelling_at), "cancelled_at": None,
        "request_counts": {"total": 0, "completed": 0, "failed": 0},
        "metadata": batch.metadata, "model": job.model if job is not None else None,
        "usage": None, "anex_job_id": str(job.pk) if job is not None else None,
    }
    if job is None:
        return out
    completed = (job.success_rows or 0) + (job.truncated_rows or 0)
    failed = (job.error_rows or 0) + (job.format_error_rows or 0)
    if status == "expired":  # OpenAI counts the requests that never ran as failed
        failed = max((job.row_count or 0) - completed, failed)
    out["request_counts"] = {"total": job.row_count or 0, "completed": completed,
                             "failed": failed}
    out["in_progress_at"] = _epoch(job.approved_at)
    if job.status in (JobStatus.FINALIZING, JobStatus.DONE) or (
            job.status in (JobStatus.FAILED, JobStatus.CANCELLED) and job.approved_at):
        out["finalizing_at"] = _epoch(_event_at(job, JobStatus.FINALIZING))
    if status == "completed":
        out["completed_at"] = _epoch(job.finished_at)
    elif status == "failed":
        out["failed_at"] = _epoch(job.finished_at)
    elif status == "cancelled":
        out["cancelled_at"] = _epoch(job.finished_at)
    elif status == "expired":
        out["expired_at"] = _epoch(job.finished_at)
    if status == "cancelled" and out["cancelling_at"] is None:
        out["cancelling_at"] = _epoch(_event_at(job, JobStatus.CANCELLING) or job.finished_at)
    if job.approved_at is not None:
        out["usage"] = _usage(job)
    if job.status in (JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED) \
            and job.result_key and job.data_deleted_at is None:
        files = result_files(batch)
        out["output_file_id"] = files.get(FilePart.OUTPUT)
        out["error_file_id"] = files.get(FilePart.ERROR)
    return out


# -- creating ------------------------------------------------------------------------------

def batch_window(completion_window: str) -> timedelta:
    """A batch's completion window as a duration (24 h for a window stored before 72h was
    offered, which can only be 24h)."""
    return COMPLETION_WINDOWS.get(completion_window, WINDOW)


def batch_priority(completion_window: str, metadata: dict[str, str] | None) -> Priority:
    """The urgency tier a batch's job runs in: metadata's anex_priority when given, else
    its completion window's (24h standard, 72h flex)."""
    named = (metadata or {}).get(PRIORITY_METADATA)
    return Priority(named) if named is not None else WINDOW_TIER[completion_window]


def metadata_problem(metadata: object) -> str | None:
    if metadata is None:
        return None
    if not isinstance(metadata, dict):
        return "metadata must be an object of string keys and string values."
    if len(metadata) > METADATA_PAIRS:
        return f"metadata holds {len(metadata)} pairs; at most {METADATA_PAIRS} are allowed."
    for key, value in metadata.items():
        if not isinstance(value, str):
            return f"metadata.{key} must be a string."
        if len(key) > METADATA_KEY_CHARS:
            return f"metadata keys are at most {METADATA_KEY_CHARS} characters."
        if len(value) > METADATA_VALUE_CHARS:
            return f"metadata.{key} is over {METADATA_VALUE_CHARS} characters."
    named = metadata.get(PRIORITY_METADATA)
    if named is not None and named not in Priority.values:
        return (f"metadata.{PRIORITY_METADATA} must be one of flex, standard, priority; "
                f"got '{named}'.")
    return None


@dataclass(frozen=True)
class _Named:
    """The model the file's first row that names one names, with its line, and the
    sizes of the lines up to it (each is checked against that model's line cap)."""

    model: str
    line: int
    sizes: tuple[int, ...]


def _first_model(file: OpenAIFile) -> _Named | list[dict[str, Any]]:
    """The model the file's first row that names one names; or the errors that fail the
    batch (an empty file, no model named). Read as the rows are read, never decoded
    whole in this request (jobs.jsonl_scan: a long line is scanned for its body.model).

    The file is judged by the format check every input passes (jobs.services.inputs): one
    it finds empty is OpenAI's empty_file, at once. One whose first line is no JSON object
    is left to the job's checks, which name that line as OpenAI does (invalid_json_line),
    with every other bad one (docs/dev/decisions/2026-12-06-openai-on-the-shared-rules.md)."""
    item = file.input
    assert item is not None
    if input_format_problem(item=item) == EMPTY_FILE:
        return [_error("empty_file", "The input file is empty: a batch needs at least "
                                     "one request.")]
    sizes: list[int] = []
    with storage_for(item.data_residency).open(item.object_key, pin=item.content_pin) as stream:
        for line in lines_body_model(stream, lines=MODEL_SCAN_LINES, max_bytes=MODEL_SCAN_BYTES):
            sizes.append(line.size)
            if line.model is not None:
                return _Named(line.model, line.number, tuple(sizes))
    return [_error("missing_model", "No row names its model in body.model: each row of a "
                                    "batch names the model that runs it.", line=1)]


def _too_long(named: _Named, model: CatalogModel) -> list[dict[str, Any]] | None:
    """The first line read over the model's line cap, refused now as the job's checks
    would refuse it (jobs.validation.lines), before a job is made for it."""
    cap = line_max_bytes(model, catalog_limits())
    for number, size in enumerate(named.sizes, start=1):
        if size > line_limit(cap):
            return [_error("invalid_request", line_too_long(number, cap).message,
                           line=number)]
    return None


def _error(code: str, message: str, *, line: int | None = None,
           param: str | None = None) -> dict[str, Any]:
    return {"code": code, "line": line, "message": message, "param": param}


def batch_create(*, organization: Organization, actor: Actor, host_region: Region,
                 input_file_id: str, endpoint: str, completion_window: str,
                 metadata: dict[str, str] | None) -> OpenAIBatch:
    """POST /batches: the batch at once, validating; or failed, errors naming why, when
    its file names no model the endpoint serves or the organization has no credits."""
    if endpoint not in ENDPOINTS:
        raise Invalid(f"endpoint must be one of {', '.join(ENDPOINTS)}.",
                      extra={"param": "endpoint"})
    if completion_window not in COMPLETION_WINDOWS:
        raise Invalid(COMPLETION_WINDOW_INVALID, extra={"param": "completion_window"})
    problem = metadata_problem(metadata)
    if problem:
        raise Invalid(problem, extra={"param": "metadata"})
    file = file_get(organization=organization, id=input_file_id)
    if file.purpose != FilePurpose.BATCH or file.input is None:
        raise Invalid(f"File '{file.id}' has purpose {file.purpose}: a batch's input file "
                      "is uploaded with purpose 'batch'.", extra={"param": "input_file_id"})
    if file.input.status != InputStatus.READY:
        raise Invalid(f"File '{file.id}' has expired (a file is kept 7 days): upload it "
                      "again.", extra={"param": "input_file_id"})
    try:
        found = _first_model(file)
    except StorageChanged:  # deleted (DELETE /files/{id}, its expiry) as it was read
        raise NotFound(FILE_NOT_FOUND.format(id=file.id)) from None
    errors: list[dict[str, Any]] | None = found if isinstance(found, list) else None
    job: Job | None = None
    if errors is None:
        assert isinstance(found, _Named)
        model_id, line = found.model, found.line
        model = model_get(model_id)
        served = kind_for(model).endpoint if model is not None else None
        if model is not None and served != endpoint:
            errors = [_error("url_mismatch", f"Model '{model_id}' serves {served}, and this "
                             f"batch's endpoint is {endpoint}: a batch's rows target its "
                             "endpoint.", line=line, param="body.model")]
        elif model is not None and (too_long := _too_long(found, model)):
            errors = too_long
        else:
            try:
                # OpenAI's batch policy: each row names the model, every failing row is
                # named, and there is no approval step.
                request = JobRequest(options=JobOptions(model=model_id, row_model=True),
                                     input_id=str(file.input.pk),
                                     priority=batch_priority(completion_window, metadata))
                job = job_submit(organization=organization, actor=actor, host_region=host_region,
                                 request=request, approve_at_estimate=True,
                                 collect_row_errors=True)
            except PaymentRequired as error:
                errors = [_error("insufficient_credits", error.detail)]
            except Malformed as error:
                errors = [_error("model_not_found", error.detail, line=line,
                                 param="body.model")]
    return OpenAIBatch.objects.create(
        organization=organization, job=job, input_file=file, endpoint=endpoint,
        completion_window=completion_window, metadata=metadata, errors=errors,
        failed_at=timezone.now() if errors else None)


def batch_cancel(*, batch: OpenAIBatch, actor: Actor) -> OpenAIBatch:
    """POST /batches/{id}/cancel: cancelling, then cancelled (the job's cancel, its
    finished rows kept); a batch already finished is answered unchanged."""
    job = batch.job
    if job is None or batch_status(batch) not in ("validating", "in_progress", "cancelling"):
        return batch  # finished, or finalizing: too late, answered as it is
    try:
        job_cancel(job=job, actor=actor)
    except DomainError:
        # it began finalizing, or finished, meanwhile: answered as it is now
        return batch_get(organization=batch.organization, id=batch.id)
    if batch.cancelling_at is None:
        OpenAIBatch.objects.filter(pk=batch.pk, cancelling_at__isnull=True).update(
            cancelling_at=timezone.now())
    return batch_get(organization=batch.organization, id=batch.id)


EXPIRY = Actor(system="openai-expiry")
# A sweep's share: the rest wait for the next (anex/periodic.py).
EXPIRE_BATCH = 500


def batches_expire(*, now: datetime | None = None) -> int:
    """Batches past their completion window expire as OpenAI's do: each one's job is
    cancelled with the job's own cancel (jobs.services.lifecycle.job_cancel), so no new
    row starts, the rows running finish, and the finished rows are delivered and billed,
    nothing else; the batch reads `expired` once its job has stopped. One already
    cancelled, or whose job is finalizing (too late to stop: it completes), is let be.
    Safe to run twice: a batch is marked once, in the cancel's transaction."""
    now = now or timezone.now()
    past = Q()
    for window, length in COMPLETION_WINDOWS.items():
        past |= Q(completion_window=window, created_at__lte=now - length)
    due = OpenAIBatch.objects.filter(
        past, expired_at__isnull=True, cancelling_at__isnull=True,
        job__isnull=False, job__cancel_requested=False,
    ).exclude(job__status__in=[*TERMINAL_STATUSES, JobStatus.FINALIZING]) \
        .select_related("job").order_by("created_at")[:EXPIRE_BATCH]
    expired = 0
    for batch in due:
        assert batch.job is not None
        try:
            with transaction.atomic():
                job_cancel(job=batch.job, actor=EXPIRY)
                expired += OpenAIBatch.objects.filter(
                    pk=batch.pk, expired_at__isnull=True).update(expired_at=now)
        except DomainError:
            continue  # it began finalizing meanwhile: it completes
    return expired


def batches_page(*, organization: Organization, after: str | None,
                 limit: int) -> tuple[list[OpenAIBatch], bool]:
    """Newest first; `after` is the last id of the previous page."""
    batches = OpenAIBatch.objects.for_org(organization).select_related("job", "input_file")
    if after:
        cursor = OpenAIBatch.objects.for_org(organization).filter(pk=after).first()
        if cursor is None:
            raise NotFound(NOT_FOUND.format(id=after))
        batches = batches.filter(Q(created_at__lt=cursor.created_at)
                                 | Q(created_at=cursor.created_at, id__lt=cursor.id))
    page = list(batches.order_by("-created_at", "-id")[:limit + 1])
    return page[:limit], len(page) > limit


# -- files ---------------------------------------------------------------------------------

FILE_NOT_FOUND = "No such File object: {id}"


def file_get(*, organization: Organization, id: str) -> OpenAIFile:
    file = OpenAIFile.objects.for_org(organization).select_related("input", "batch__job") \
        .filter(pk=id, deleted_at__isnull=True).first()
    if file is None:
        raise NotFound(FILE_NOT_FOUND.format(id=id))
    return file


def file_object(file: OpenAIFile) -> dict[str, Any]:
    item = file.input
    expires = item.expires_at if item is not None else (
        file.batch.job.data_expires_at if file.batch is not None and file.batch.job else None)
    return {"id": file.id, "object": "file", "bytes": file.bytes,
            "created_at": _epoch(file.created_at), "filename": file.filename,
            "purpose": file.purpose, "status": "processed", "expires_at": _epoch(expires),
            "status_details": None}


def file_residency(file: OpenAIFile) -> str:
    """The region that keeps the file's bytes."""
    if file.input is not None:
        return file.input.data_residency
    assert file.batch is not None and file.batch.job is not None
    return file.batch.job.data_residency


def _part(failed: bool) -> FilePart:
    return FilePart.ERROR if failed else FilePart.OUTPUT


def result_part_lines(job: Job, part: FilePart) -> Iterator[bytes]:
    """The result file's lines of one part, in order, byte for byte."""
    return (line for line, failed in result_lines(job) if _part(failed) == part)


def result_files(batch: OpenAIBatch) -> dict[str, str]:
    """The batch's output and error file ids (each made on first sight of the finished
    job's result, its size the one recorded when the job ended: the file is not read); a
    part with no rows has none, and one deleted (DELETE /files/{id}) is no longer named."""
    made = list(batch.files.all())
    job = batch.job
    if made or job is None:
        return {file.part: file.id for file in made if file.deleted_at is None}
    if job.result_output_bytes is not None:
        sizes = {FilePart.OUTPUT: job.result_output_bytes,
                 FilePart.ERROR: job.result_error_bytes or 0}
    else:  # a job that ended before the sizes were recorded: counted once, here
        sizes = {FilePart.OUTPUT: 0, FilePart.ERROR: 0}
        for line, failed in result_lines(job):
            sizes[_part(failed)] += len(line)
    if not any(sizes.values()):
        return {}
    with transaction.atomic():
        for part, size in sizes.items():
            if size:
                OpenAIFile.objects.get_or_create(
                    batch=batch, part=part,
                    defaults={"organization_id": batch.organization_id, "bytes": size,
                              "purpose": FilePurpose.BATCH_OUTPUT,
                              "filename": f"{batch.id}_{part}.jsonl"})
    return {file.part: file.id for file in batch.files.all() if file.deleted_at is None}


def file_chunks(file: OpenAIFile) -> Iterator[bytes]:
    """GET /files/{id}/content: the bytes as uploaded, or the part of the result."""
    if file.input is not None:
        item = file.input
        if item.status != InputStatus.READY:
            raise NotFound(f"File '{file.id}' has expired and its content is deleted.")

        def uploaded() -> Iterator[bytes]:
            with storage_for(item.data_residency).open(item.object_key,
                                                       pin=item.content_pin) as stream:
                yield from iter(lambda: stream.read(1024 * 1024), b"")

        return uploaded()
    assert file.batch is not None and file.batch.job is not None
    job = file.batch.job
    if job.data_deleted_at is not None or not job.result_key:
        raise NotFound(f"File '{file.id}' has been deleted with its batch's data.")
    return result_part_lines(job, FilePart(file.part))


# What a file object (file_object) reads, and nothing more: a page of OpenAI's 10,000
# files is one query over these columns, never a job's JSON (its errors, its sample) nor
# a storage read per file.
FILE_OBJECT_COLUMNS = ("id", "organization_id", "bytes", "created_at", "filename", "purpose",
                       "input", "input__expires_at", "batch", "batch__job",
                       "batch__job__data_expires_at")


def files_page(*, organization: Organization, after: str | None, limit: int, order: str,
               purpose: str | None) -> tuple[list[OpenAIFile], bool]:
    """A page of files (OpenAI's page: up to 10,000), in one query of the columns a file
    object shows, after the cursor's."""
    files = OpenAIFile.objects.for_org(organization).filter(deleted_at__isnull=True) \
        .select_related("input", "batch__job").only(*FILE_OBJECT_COLUMNS)
    if purpose:
        files = files.filter(purpose=purpose)
    newest = order == "desc"
    if after:
        cursor = OpenAIFile.objects.for_org(organization).filter(pk=after).first()
        if cursor is None:
            raise NotFound(FILE_NOT_FOUND.format(id=after))
        if newest:
            files = files.filter(Q(created_at__lt=cursor.created_at)
                                 | Q(created_at=cursor.created_at, id__lt=cursor.id))
        else:
            files = files.filter(Q(created_at__gt=cursor.created_at)
                                 | Q(created_at=cursor.created_at, id__gt=cursor.id))
    ordering = ("-created_at", "-id") if newest else ("created_at", "id")
    page = list(files.order_by(*ordering)[:limit + 1])
    return page[:limit], len(page) > limit


def file_delete(*, file: OpenAIFile) -> None:
    """DELETE /files/{id}: gone from this surface at once. An uploaded file's bytes go
    with it unless a batch still running reads them (then once it has ended, by the
    input expiry's next sweep: jobs.services.purge input_data_purge); a batch's output or
    error file is a view of the job's result, which stays available through the anex API
    until DELETE /batch/v1/jobs/{id}/data (its batch no longer names it, result_files)."""
    OpenAIFile.objects.filter(pk=file.pk).update(deleted_at=timezone.now())
    if file.input is not None and file.input.deleted_at is None:
        input_data_purge(item=file.input)

