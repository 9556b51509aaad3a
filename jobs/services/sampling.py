"""The sampled estimate: for chat jobs whose output length is not given (or a reasoning
model with no thinking budget), a random sample of rows is generated under the job's own
thinking and response_format settings, and the caps are set from what it used.

The rule (docs/estimates.md): with n sampled rows, the k-th smallest output length is an
upper bound of the 95th percentile with at least 95% confidence when
P(Binomial(n, 0.95) < k) >= 0.95; the smallest such k is used. Distribution-free, it needs
n >= 59; a file with fewer rows than the sample size is generated whole, and then the
largest length is exact for every row.
"""

from __future__ import annotations

import logging
import math
import random
import time
import uuid
from dataclasses import dataclass

from billing.pricing import Usage, price
from inference.catalog import CatalogModel, model_get
from inference.warmth import startup_seconds
from jobs.constants import FailureCode, JobStatus, TaskType
from jobs.models import Job
from jobs.services.lifecycle import job_cost_ready, job_fail, job_lease_claim
from jobs.services.rows import InputRow, chat_kwargs, row_response_format, rows_read
from jobs.services.running import chunks_plan

logger = logging.getLogger(__name__)

SAMPLE_ROWS = 64
QUANTILE = 0.95
CONFIDENCE = 0.95
# Room for the thinking trace to be closed by the budget notice before the answer.
BUDGET_NOTICE_TOKENS = 64


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


class EstimateFailed(Exception):
    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


def _sample_rows(job: Job) -> tuple[list[InputRow], bool]:
    """A uniform random sample of the job's rows (all of them when the file is small)."""
    total = job.row_count or 0
    whole = total <= SAMPLE_ROWS
    wanted = set(range(total)) if whole else set(random.sample(range(total), SAMPLE_ROWS))
    rows: list[InputRow] = []
    for chunk in chunks_plan(job):
        span = range(chunk.first_row, chunk.first_row + chunk.row_count)
        if wanted.isdisjoint(span):
            continue
        rows += [row for row in rows_read(job, chunk) if row.index in wanted]
    return rows, whole


def sample_generate(job: Job, model: CatalogModel) -> SampleResult:
    from inference import engines

    rows, whole = _sample_rows(job)
    ceiling = job.max_output_tokens_requested or model.max_output_tokens or 32_768
    thinking_wanted = model.reasoning and job.reasoning is not False \
        and job.reasoning_budget_requested is None
    engine = engines.engine_for(job.model)
    started = time.monotonic()
    outcomes = engine.generate(  # type: ignore[union-attr]
        [engines.ChatRow(messages=row.body.get("messages") or [],
                         chat_template_kwargs=chat_kwargs(job, row.body),
                         response_format=row_response_format(job, row.body)) for row in rows],
        engines.ChatSettings(max_tokens=ceiling,
                             reasoning_budget=job.reasoning_budget_requested or None))
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
                        tokens_per_second=produced / elapsed)


def job_sample(*, job_id: uuid.UUID | str) -> JobStatus | None:
    """The sampled estimate (on a worker serving the model); then cost_ready. Claimed
    once; a failure other than the output not fitting (the engine not starting, storage)
    is handed out again and fails the job past the cap (jobs.services.recovery)."""
    if not job_lease_claim(job_id=job_id, status=JobStatus.ESTIMATING,
                           row_count__isnull=False):
        return None
    job = Job.objects.select_related("input", "organization").get(pk=job_id)
    model = model_get(job.model)
    if model is None or model.task != TaskType.CHAT:
        return None
    try:
        result = sample_generate(job, model)
    except EstimateFailed as failure:
        job_fail(job=job, code=FailureCode.INVALID_INPUT, reason=failure.message)
        return JobStatus.FAILED
    except Exception:
        logger.exception("sample of job %s failed", job.pk)
        from jobs.services.recovery import SAMPLE, lease_retry

        lease_retry(SAMPLE, Job.objects.get(pk=job.pk))
        return None
    rows = job.row_count or 0
    usage = Usage(input_tokens=job.est_input_tok or 0,
                  output_tokens=rows * result.max_output_tokens)
    # The sample just ran on this worker's engine, so the start-up is a warm one.
    seconds = startup_seconds(model_id=model.id, task=model.task) + int(
        (usage.input_tokens + usage.output_tokens) / max(result.tokens_per_second, 1.0))
    return job_cost_ready(job=job, estimate={
        "max_output_tokens": result.max_output_tokens,
        "reasoning_budget": result.reasoning_budget if result.reasoning_budget is not None
        else job.reasoning_budget,
        "est_output_tok": usage.output_tokens, "est_cost_cents": price(model, usage).cents,
        "est_processing_seconds": seconds})
