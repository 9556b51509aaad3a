"""The sampled estimate: for chat jobs whose output length is not given (or a reasoning
model with no thinking budget), a random sample of rows is generated under the job's own
thinking and response_format settings, and the caps are set from what it used.

The rule (docs/estimates.md): with n sampled rows, the k-th smallest output length is an
upper bound of the 95th percentile with at least 95% confidence when
P(Binomial(n, 0.95) < k) >= 0.95; the smallest such k is used. Distribution-free, it needs
n >= 59; a file with fewer rows than the sample size is generated whole, and then the
largest length is exact for every row.

Samples are free to the customer, so they are bounded
(docs/dev/decisions/2026-12-01-job-lifecycle.md): an organization may use
ANEX_SAMPLE_TOKENS_PER_HOUR sampled tokens an hour. A sample's worst case is reserved when it is
queued and replaced by what it used; once the hour's allowance is spent, a submit that would need a
sample answers 429 and a job already waiting for one fails unbilled, both saying how to skip the
sample. Samples go to their own queue per region and model, and a worker holding both runs a sample
before its chunks (jobs.tasks SAMPLE_PRIORITY: a sample waits for no backlog). But a sample is free
and holds a worker's thread for as long as its rows generate, so a worker runs SAMPLES_AT_ONCE of
them at a time: a sample that finds the place taken goes back to its queue for a few
seconds, its thread free for paid chunks, and a flood of samples holds at most one thread
of each worker serving the model.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from anex.errors import RateLimited
from billing.services import organization_lock
from inference.catalog import CatalogModel, model_get
from inference.constants import MAX_OUTPUT_TOKENS, InputFormat
from inference.engines import ChatSettings
from inference.kinds import kind_for
from inference.kinds.base import InputRow
from inference.kinds.chat import ChatKind
from inference.kinds.media import media_context, media_windows
from inference.pricing import Usage, price, usage_from_json, usage_json
from inference.warmth import startup_seconds
from jobs import dispatch
from jobs.constants import FailureCode, JobStatus, JobSubstate
from jobs.failures import (
    BREAKER_RESEND_MS,
    Breaker,
    ClaimedWorkFailed,
    FailureClass,
    backoff_ms,
    breaker_for,
    failure_class,
)
from jobs.jsonl import input_rows
from jobs.models import Job
from jobs.services.lifecycle import (
    WORKER,
    job_cost_ready,
    job_fail,
    job_lease_claim,
    job_transition,
)
from jobs.services.rows import rows_at
from jobs.storage import storage_for

logger = logging.getLogger(__name__)

SAMPLE_ROWS = 64
QUANTILE = 0.95
CONFIDENCE = 0.95
# Room for the thinking trace to be closed by the budget notice before the answer.
BUDGET_NOTICE_TOKENS = 64
# The allowance of sampled tokens is counted over this sliding window.
SAMPLE_WINDOW = timedelta(hours=1)
# Samples a worker process runs at once (above), and about how long one that finds them
# all taken waits in its queue before it is offered again (jittered, jobs.failures).
SAMPLES_AT_ONCE = 1
SAMPLE_WAIT_MS = 5_000
_sample_places = threading.BoundedSemaphore(SAMPLES_AT_ONCE)


def sample_send(job: Job, *, delay_ms: int | None = None) -> None:
    dispatch.sample_send(job_id=job.pk, region=job.data_residency, model=job.model,
                         delay_ms=delay_ms)


# --- the hourly allowance ---------------------------------------------------------------


@dataclass(frozen=True)
class SampleAllowance:
    used: int  # sampled tokens (reserved or used) in the window
    limit: int
    retry_after: int  # seconds until the window drops below the limit (0: it is below)

    @property
    def spent(self) -> bool:
        return self.used >= self.limit

    def message(self) -> str:
        minutes = max(1, math.ceil(self.retry_after / 60))
        return (f"This organization has used its hourly allowance of sampled estimates: "
                f"{self.used:,} of {self.limit:,} sampled tokens in the last hour. A job "
                "that omits max_output_tokens (or, on a reasoning model, reasoning_budget) "
                "is priced from a sample; set them to price it without one, or submit it "
                f"again in {minutes} minute{'s' if minutes != 1 else ''}.")


def sample_allowance(*, organization_id: uuid.UUID,
                     now: datetime | None = None) -> SampleAllowance:
    now = now or timezone.now()
    recent = list(Job.objects.filter(organization_id=organization_id,
                                     sampled_at__gt=now - SAMPLE_WINDOW)
                  .order_by("sampled_at").values_list("sampled_at", "sample_tokens"))
    used = sum(tokens or 0 for _, tokens in recent)
    limit = settings.ANEX_SAMPLE_TOKENS_PER_HOUR
    left, retry_after = used, 0
    for at, tokens in recent:  # oldest first: when enough has aged out of the window
        if left < limit or at is None:  # never None: the filter requires a recent date
            break
        left -= tokens or 0
        retry_after = max(1, math.ceil((at + SAMPLE_WINDOW - now).total_seconds()))
    return SampleAllowance(used=used, limit=limit, retry_after=retry_after)


def sample_allowance_require(*, organization_id: uuid.UUID) -> None:
    """The submit's check for a job that will need a sample: 429 with Retry-After once the
    organization's hourly allowance is spent (the job is not created)."""
    allowance = sample_allowance(organization_id=organization_id)
    if allowance.spent:
        raise RateLimited(allowance.message(), retry_after=allowance.retry_after)


def _ceiling(job: Job, model: CatalogModel) -> int:
    # The job's cap, else the model's, else the reference's ceiling.
    return job.max_output_tokens_requested or model.max_output_tokens or MAX_OUTPUT_TOKENS


def sample_reservation(*, job: Job, model: CatalogModel, rows: int, input_tokens: int) -> int:
    """The most a sample of these rows can use: each sampled row's input (the file's
    average) and the output cap, within the model's context."""
    per_row = -(-input_tokens // max(rows, 1)) + _ceiling(job, model)
    context = max(model.context_tokens, model.media_context_tokens or 0)
    return min(rows, SAMPLE_ROWS) * min(per_row, context)


def sample_enqueue(*, job: Job, model: CatalogModel, rows: int, usage: Usage,
                   picks: list[list[int]] | None = None) -> JobStatus:
    """A job whose rows are checked and counted enters the sampling wait (estimating, as
    the customer sees it): the counts kept (the sample prices media from est_usage), the
    sampled rows kept (`picks`, recorded where the checks read a JSONL input; else
    sample_pick), the sample's worst case reserved against the hourly allowance, and the
    sample queued. With the allowance spent, it fails unbilled instead, saying how to skip
    the sample: nothing reaches a worker."""
    reserved = sample_reservation(job=job, model=model, rows=rows,
                                  input_tokens=usage.input_tokens + usage.media_tokens)
    if picks is None:
        picks = sample_pick(job, rows=rows)
    with transaction.atomic():
        # Counted and reserved under the organization lock (then the job's, in
        # job_transition): concurrent estimates of one organization cannot all see the
        # same room.
        organization_lock(job.organization_id)
        allowance = sample_allowance(organization_id=job.organization_id)
        queued = not allowance.spent and job_transition(
            job=job, to=JobSubstate.SAMPLING, actor=WORKER, row_count=rows,
            est_input_tok=usage.input_tokens + usage.media_tokens,
            est_usage=usage_json(usage), sample_tokens=reserved,
            sampled_at=timezone.now(), sample_rows=picks) is not None
    if allowance.spent:
        job_fail(job=job, code=FailureCode.INVALID_INPUT, reason=allowance.message())
        return JobStatus.FAILED
    if queued:
        sample_send(job)
    return JobStatus.ESTIMATING


def order_statistic_index(n: int, quantile: float = QUANTILE,
                          confidence: float = CONFIDENCE) -> int | None:
    """The smallest k (1-based) with P(X_(k) >= the quantile) >= confidence, or None."""
    cumulative = 0.0
    for k in range(1, n + 1):
        # P(Binomial(n, q) = k - 1), added up: P(Binomial(n, q) < k).
        cumulative += math.comb(n, k - 1) * quantile ** (k - 1) * (1 - quantile) ** (n - k + 1)
        if cumulative >= confidence:
            return k
    return None


def upper_bound(values: list[int], *, whole_file: bool) -> int:
    ordered = sorted(values)
    if whole_file:
        return ordered[-1]
    k = order_statistic_index(len(ordered))
    return ordered[(k or len(ordered)) - 1]


@dataclass(frozen=True)
class SampleResult:
    max_output_tokens: int
    reasoning_budget: int | None
    tokens_per_second: float
    tokens_used: int = 0  # prompt and generated, every sampled row: the allowance's count


class EstimateFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def sample_pick(job: Job, *, rows: int) -> list[list[int]]:
    """A uniform random sample of the job's `rows` rows (all of them when the file is
    small), as Job.sample_rows keeps it: each row's index and, for JSONL, its byte range.
    A parquet input's rows are picked by index, unread. A JSONL input's are recorded where
    the estimate's checks read it (jobs.validation.layout); this reads it whole only for a
    job whose estimate kept no picks (one queued before they were kept)."""
    wanted = set(range(rows)) if rows <= SAMPLE_ROWS \
        else set(random.sample(range(rows), SAMPLE_ROWS))
    assert job.input is not None
    if job.format == InputFormat.PARQUET:  # read by row index: no offsets to keep
        return [[index] for index in sorted(wanted)]
    # Pinned to the frozen bytes; rows counted as the run counts them (jobs.jsonl).
    with storage_for(job.data_residency).open(job.input.object_key,
                                              pin=job.input.content_pin) as stream:
        return [[index, start, end]
                for index, (start, end, _line) in enumerate(input_rows(stream))
                if index in wanted]


def _sample_rows(job: Job) -> tuple[list[InputRow], bool]:
    """The sampled rows, read alone (sample_pick chose them while estimating)."""
    total = job.row_count or 0
    picks = job.sample_rows
    if picks is None:  # queued before the picks were kept with the job
        picks = sample_pick(job, rows=total)
    return rows_at(job, picks), total <= SAMPLE_ROWS


def sample_generate(job: Job, model: CatalogModel) -> SampleResult:
    kind = kind_for(model)
    assert isinstance(kind, ChatKind), "job_sample samples the generating kind only"
    rows, whole = _sample_rows(job)
    ceiling = _ceiling(job, model)
    thinking_wanted = model.reasoning and job.reasoning is not False \
        and job.reasoning_budget_requested is None
    engine = kind.engine(job.model)
    # The rows' media brought and decoded as a chunk's are; a row whose media fail is left
    # out of the sample (it fails alone when it is served).
    requests = [kind.engine_request(job, resolved.body)
                for window in media_windows(job, rows, paths=kind.media_paths,
                                            context=media_context(job, model, kind))
                for _, resolved in window if resolved.error is None]
    started = time.monotonic()
    # The job's own rows, under its own thinking and response_format, up to the ceiling.
    generation = ChatSettings(max_tokens=ceiling,
                              reasoning_budget=job.reasoning_budget_requested or None)
    outcomes = engine.generate(requests, generation) if requests else []
    elapsed = max(time.monotonic() - started, 1e-3)
    usable = [out for out in outcomes if out.error is None]
    if not usable:
        raise EstimateFailed("We could not prepare a price for this job automatically: no "
                             "sampled row could be generated. Set max_output_tokens.")
    cut = sum(out.finish_reason == "length" for out in usable)
    if cut * 2 > len(usable):
        raise EstimateFailed(
            f"The typical answer on this job hits the maximum output length ({ceiling:,} "
            "tokens) and would be cut off. Raise max_output_tokens, set reasoning_budget "
            "(0 for no cap), or disable reasoning.")
    completion = upper_bound([out.completion_tokens for out in usable], whole_file=whole)
    budget: int | None = None
    if thinking_wanted:
        budget = upper_bound([out.reasoning_tokens for out in usable], whole_file=whole)
        answers = upper_bound([out.completion_tokens - out.reasoning_tokens
                               for out in usable], whole_file=whole)
        if job.max_output_tokens_requested is not None:
            room = job.max_output_tokens_requested - BUDGET_NOTICE_TOKENS - answers
            if room < 1:
                raise EstimateFailed(
                    "The answers alone would not fit under max_output_tokens once the "
                    "thinking budget and its cut-off notice are reserved. Raise "
                    "max_output_tokens, set reasoning_budget (0 for no cap), or disable "
                    "reasoning.")
            budget = min(budget, room)
        elif budget + BUDGET_NOTICE_TOKENS + answers > ceiling:
            raise EstimateFailed(
                "The model's reasoning runs too long on these rows to fit its maximum output "
                "length. Set reasoning_budget (0 for no cap), or disable reasoning.")
    cap = job.max_output_tokens_requested or max(1, min(ceiling, completion))
    if budget is not None and job.max_output_tokens_requested is None:
        cap = min(ceiling, max(cap, budget + BUDGET_NOTICE_TOKENS + 1))
    produced = sum(out.completion_tokens + out.prompt_tokens for out in usable)
    return SampleResult(max_output_tokens=cap, reasoning_budget=budget,
                        tokens_per_second=produced / elapsed,
                        tokens_used=sum(out.completion_tokens + out.prompt_tokens
                                        for out in outcomes))


def job_sample(*, job_id: uuid.UUID | str) -> JobStatus | None:
    """The sampled estimate (on a worker serving the model); then cost_ready. Claimed
    once; a failure other than the output not fitting (the engine not starting, storage)
    raises ClaimedWorkFailed: its actor hands it out again, and the job fails past the cap
    (jobs.services.recovery)."""
    waiting = Job.objects.filter(pk=job_id).only("model", "data_residency").first()
    if waiting is None:
        return None
    if not _sample_places.acquire(blocking=False):
        # This worker runs a sample already: this one goes back, unclaimed, rather than
        # hold a second thread that paid chunks need (or wait on one, as a blocked thread).
        sample_send(waiting, delay_ms=backoff_ms(1, base_ms=SAMPLE_WAIT_MS,
                                                 cap_ms=SAMPLE_WAIT_MS))
        return None
    try:
        breaker = breaker_for(waiting.model)
        if not breaker.allows():
            # This worker's engine for the model keeps failing: the sample goes back
            # unclaimed, for a worker whose engine answers (as a chunk does,
            # jobs.services.running).
            sample_send(waiting, delay_ms=backoff_ms(1, base_ms=BREAKER_RESEND_MS,
                                                     cap_ms=BREAKER_RESEND_MS))
            return None
        return _sample_claimed(job_id=job_id, breaker=breaker)
    finally:
        _sample_places.release()


def _sample_claimed(*, job_id: uuid.UUID | str, breaker: Breaker) -> JobStatus | None:
    """job_sample's work once this worker has a place for it: claimed, generated, priced."""
    if not job_lease_claim(job_id=job_id, state=JobSubstate.SAMPLING):
        return None
    job = Job.objects.select_related("input", "organization").get(pk=job_id)
    model = model_get(job.model)
    if model is None or not kind_for(model).generates:  # only generated text is sampled
        return None
    try:
        result = sample_generate(job, model)
    except EstimateFailed as failure:
        job_fail(job=job, code=FailureCode.INVALID_INPUT, reason=failure.message)
        return JobStatus.FAILED
    except Exception as error:
        if failure_class(error) == FailureClass.ENGINE:
            breaker.failed()
        raise ClaimedWorkFailed("sample", job_id=job.pk) from error
    breaker.succeeded()
    # What it used replaces its reservation (a sample that failed keeps the reservation).
    Job.objects.filter(pk=job.pk).update(sample_tokens=result.tokens_used)
    rows = job.row_count or 0
    # The rows as the estimate counted them, media apart (media tokens at the media rate,
    # the per-image, per-clip and per-minute charges), plus the sampled output cap: the
    # same usage the final charge is priced from (jobs.services.metering).
    counted = usage_from_json(job.est_usage) if job.est_usage is not None else Usage(
        input_tokens=job.est_input_tok or 0)
    usage = counted + Usage(output_tokens=rows * result.max_output_tokens)
    # The sample just ran on this worker's engine, so the start-up is a warm one.
    seconds = startup_seconds(model_id=model.id, task=model.task) + int(
        (usage.input_tokens + usage.media_tokens + usage.output_tokens)
        / max(result.tokens_per_second, 1.0))
    return job_cost_ready(job=job, estimate={
        "max_output_tokens": result.max_output_tokens,
        "reasoning_budget": result.reasoning_budget if result.reasoning_budget is not None
        else job.reasoning_budget,
        "est_output_tok": usage.output_tokens,
        "est_cost_cents": price(model, usage, job.priority).cents,
        "est_processing_seconds": seconds})
