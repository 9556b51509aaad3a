"""Estimating: every row checked, input tokens counted exactly, and (when the output length
is known) the job priced and moved to cost_ready.

That read is the one whole read of the input before its rows run: as the checks read a
JSONL input they record where its chunks end and which rows a sample runs
(jobs.validation.layout), kept for the start (ChunkPlan) and the sample (Job.sample_rows);
and, with ANEX_GROUP_ROWS, every row's share keys, from which the rows that share work are
planned together (jobs.validation.grouping; the plan's order kept on ChunkPlan, what the
rows share stated on the job).

Runs in the job_estimate_task actor. Embedding and decision jobs, and chat jobs with an
explicit max_output_tokens (and, on a reasoning model, a reasoning_budget or thinking off),
are priced here from exact counts. Other chat jobs enter the sampling wait, rows checked
and counted, for the sampled estimate (jobs.services.sampling; still estimating to the
customer).
"""

from __future__ import annotations

import functools
import logging
import shutil
import tempfile
import uuid
from dataclasses import dataclass

from django.conf import settings

from anex.net import FetchError, fetch
from inference.catalog import CatalogModel, model_get
from inference.constants import InputFormat
from inference.kinds import kind_for
from inference.pricing import price
from inference.rows.core import CountTokens, FileReport, InputRejected, JobOptions
from inference.tokens import token_counter, uncounted
from inference.warmth import startup_seconds
from jobs.constants import INPUT_ERRORS_MAX, FailureCode, JobStatus, TaskType
from jobs.failures import claimed_work
from jobs.models import ChunkPlan, Input, Job
from jobs.services.inputs import INPUT_CHANGED
from jobs.services.lifecycle import (
    WORKER,
    job_cost_ready,
    job_finish,
    job_lease_claim,
    job_transition,
)
from jobs.services.sampling import SAMPLE_ROWS, sample_enqueue
from jobs.storage import StorageChanged, storage_for
from jobs.validation import RowError, RowErrors, validate_jsonl, validate_parquet
from jobs.validation.grouping import ShareKeys, order_bytes, starts_bytes
from jobs.validation.layout import InputLayout, RowLayout

logger = logging.getLogger(__name__)

CANNOT_PRICE = "We could not prepare a price for this job automatically."


def media_content_type(url: str, *, organization_id: uuid.UUID) -> str | None:
    """The best-effort HEAD probe for an extensionless audio/video URL (through the
    SSRF-safe fetcher, the lookup the organization's). None when the host does not answer
    usefully: never a refusal."""
    try:
        with fetch("HEAD", url, tenant=organization_id, connect_timeout=3,
                   read_timeout=5) as response:
            if not 200 <= response.status < 300:
                return None
            value = response.headers.get("Content-Type")
            return value.split(";")[0].strip().lower() if value else None
    except FetchError:
        return None


def needs_sample(job: Job, model: CatalogModel) -> bool:
    """Whether the job is priced from a sampled output length (its kind decides, from what
    the job asked for)."""
    return kind_for(model).needs_sample(model, job.options())


def _claim(job: Job) -> bool:
    """submitted -> estimating; or an estimate the recovery pass handed out again (its
    worker died before the rows were counted)."""
    return job_transition(job=job, to=JobStatus.ESTIMATING, actor=WORKER) is not None or \
        job_lease_claim(job_id=job.pk, state=JobStatus.ESTIMATING)


def input_error_json(error: RowError) -> dict[str, object]:
    """A refused row as Job.input_errors keeps it."""
    return {"line": error.line, "custom_id": error.custom_id, "code": error.code,
            "message": error.reason}


@dataclass(frozen=True)
class InputChecked:
    """An input's rows checked against a job's options, and counted."""

    report: FileReport
    # The model's tokenizer counted the text. Without one here the text counted as none
    # (inference.tokens.uncounted), so the rows were checked but cannot be priced.
    counted: bool


def input_check(*, item: Input, options: JobOptions, errors: RowErrors | None = None,
                layout: RowLayout | None = None) -> InputChecked:
    """The one driver of a job's estimate and of a preflight check: every row check runs,
    tokenizer or not, so a row that breaks a rule is refused with its own reason and only
    a file whose rows pass can fail for want of a price (CANNOT_PRICE)."""
    count_tokens = token_counter(options.model)
    report = input_validate(item=item, options=options,
                            count_tokens=count_tokens or uncounted, errors=errors,
                            layout=layout)
    return InputChecked(report=report, counted=count_tokens is not None)


def input_validate(*, item: Input, options: JobOptions, count_tokens: CountTokens,
                   errors: RowErrors | None = None,
                   layout: RowLayout | None = None) -> FileReport:
    """Every row of the input checked against a job's options and counted: a job's
    estimate, and (collecting every failing row in `errors`) a preflight check. A JSONL
    input's `layout` records where its rows lie as they are read (a job's estimate)."""
    storage = storage_for(item.data_residency)
    probe = functools.partial(media_content_type, organization_id=item.organization_id)
    # Pinned to the bytes the input froze on: a swapped file raises StorageChanged.
    with storage.open(item.object_key, pin=item.content_pin) as stream:
        if item.format == InputFormat.JSONL:
            return validate_jsonl(stream, options,  # type: ignore[arg-type]
                                  count_tokens=count_tokens,
                                  probe_content_type=probe, errors=errors,
                                  layout=layout)
        # Parquet is read by row group, which needs a seekable file: spool it to disk.
        with tempfile.TemporaryFile() as local:
            shutil.copyfileobj(stream, local, 1024 * 1024)
            local.seek(0)
            return validate_parquet(local, options, count_tokens=count_tokens,
                                    probe_content_type=probe, errors=errors)


def _estimate_fields(job: Job, model: CatalogModel, report: FileReport) -> dict[str, object]:
    kind = kind_for(model)
    usage = kind.estimate_usage(model, report,
                                max_output_tokens=job.max_output_tokens_requested)
    input_tokens = usage.all_input_tokens
    generated = input_tokens + usage.output_tokens
    # Processing time is the start-up the workers measured (inference/warmth.py) plus the
    # tokens at the kind's conservative rate (a chat job's sample measures its own rate).
    seconds = (startup_seconds(model_id=model.id, task=kind.task)
               + generated // kind.tokens_per_second)
    return {
        "est_input_tok": input_tokens,
        "est_output_tok": usage.output_tokens,
        "est_cost_cents": price(model, usage, job.priority).cents,
        "est_processing_seconds": seconds,
    }


def job_estimate(*, job_id: uuid.UUID | str) -> JobStatus | None:
    """The job_estimate_task actor's work; a job already past this stage is left alone.
    An unexpected failure once claimed (storage, a tokenizer that will not load) raises
    ClaimedWorkFailed: its actor hands the work out again (jobs.tasks)."""
    job = Job.objects.select_related("input", "organization").get(pk=job_id)
    if job.input_id is None:
        # A re-run whose input is still being derived (jobs.services.rerun): its own task
        # sends the estimate once it is.
        return None
    if not _claim(job):
        return None
    with claimed_work("estimate", job_id=job.pk):
        return _estimate(job)


def _estimate(job: Job) -> JobStatus | None:
    model = model_get(job.model)
    if model is None:
        return _failed(job, CANNOT_PRICE)
    assert job.input is not None
    # A job that collects its failing rows reads on past the first (a preflight check's
    # mode) and fails on the first, every one kept in input_errors.
    errors = RowErrors(INPUT_ERRORS_MAX) if job.collect_row_errors else None
    # Where a JSONL input's rows lie, recorded as the checks read it: the start plans its
    # chunks and the sample reads its rows from it, never reading the whole input again.
    layout = RowLayout(chunk_rows=settings.ANEX_CHUNK_ROWS, sample_rows=SAMPLE_ROWS,
                       keys=_share_keys(job)) if job.format == InputFormat.JSONL else None
    try:
        checked = input_check(item=job.input, options=job.options(), errors=errors,
                              layout=layout)
        if errors is not None and errors.count:
            return _failed(job, errors.items[0].reason, errors=errors.items)
        if not checked.counted:
            return _failed(job, CANNOT_PRICE)
        report = checked.report
        fields = {} if needs_sample(job, model) else _estimate_fields(job, model, report)
    except InputRejected as rejected:
        return _failed(job, rejected.message, errors=[RowError(rejected.message,
                                                               code=rejected.code)]
                       if job.collect_row_errors else None)
    except StorageChanged:
        return _failed(job, INPUT_CHANGED)
    laid = layout.finish(report.rows) if layout is not None else None
    if laid is not None:
        _plan_keep(job, laid)
    if not fields:
        # Checked and counted; the sampled estimate takes it from here, on a worker that
        # serves the model, under a lease of its own and within the organization's hourly
        # allowance of sampled tokens.
        return sample_enqueue(job=job, model=model, rows=report.rows, usage=report.usage,
                              picks=laid.picks if laid is not None else None)
    return job_cost_ready(job=job, estimate={"row_count": report.rows, **fields})


def _share_keys(job: Job) -> ShareKeys | None:
    """The recorder of the rows' share keys, where rows are grouped: chat rows by their
    prompts' prefixes and whole, embedding and decision rows whole (no prefix is shared
    work for them: an identical row is)."""
    if not settings.ANEX_GROUP_ROWS:
        return None
    return ShareKeys(prefixes=job.task_type == TaskType.CHAT)


def _plan_keep(job: Job, laid: InputLayout) -> None:
    """The start's plan (chunk ends; a grouped plan's order and row starts) and what the
    rows share, stated on the job with the estimate."""
    grouped = laid.grouped
    order = grouped.order if grouped is not None else None
    ChunkPlan.objects.update_or_create(job=job, defaults={
        "chunk_rows": laid.chunk_rows, "chunk_ends": laid.chunk_ends,
        "row_order": order_bytes(order) if order is not None else None,
        "row_starts": starts_bytes(grouped.starts)
        if grouped is not None and order is not None else None})
    share = grouped.shared_prefix_share if grouped is not None else None
    identical = grouped.identical_rows if grouped is not None else None
    Job.objects.filter(pk=job.pk).update(est_shared_prefix_share=share,
                                         est_identical_rows=identical)
    job.est_shared_prefix_share, job.est_identical_rows = share, identical


def _failed(job: Job, reason: str, *, errors: list[RowError] | None = None) -> JobStatus:
    """Fails the job unbilled, invalid_input with the reason as its failure_reason (and,
    for a job that collects them, its refused rows as input_errors)."""
    outcome = {"input_errors": [input_error_json(error) for error in errors]} \
        if errors is not None else None
    job_finish(job=job, status=JobStatus.FAILED, failure_code=FailureCode.INVALID_INPUT,
               failure_reason=reason, outcome=outcome)
    return JobStatus.FAILED
