from __future__ import annotations

import functools
import operator
import uuid
from typing import Any

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.utils import timezone

from anex.regions import Region
from console.tenancy import OrgScopedQuerySet
from inference.constants import InputFormat
from inference.rows.core import JobOptions
from jobs.constants import (
    SUBSTATE_OF,
    TERMINAL_STATUSES,
    CheckStatus,
    ChunkStatus,
    DeliveryStatus,
    FailureCode,
    InputStatus,
    JobState,
    JobStatus,
    JobSubstate,
    Priority,
    TaskType,
    dispatch_tier,
    job_state,
)


class Job(models.Model):
    """A batch job: an input run through one model. Its status changes only through
    jobs.services, each change a guarded transition (docs/dev/style.md rule 3)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "console.Organization", on_delete=models.PROTECT, related_name="jobs"
    )
    input = models.ForeignKey("jobs.Input", null=True, blank=True, on_delete=models.PROTECT,
                              related_name="jobs")
    model = models.CharField(max_length=100)
    task_type = models.CharField(max_length=8, choices=TaskType.choices, default=TaskType.CHAT)
    format = models.CharField(max_length=8, choices=InputFormat.choices,
                              default=InputFormat.JSONL)
    data_residency = models.CharField(max_length=8, choices=Region.choices,
                                      default=Region.WORLD)
    # The urgency tier (jobs.constants.Priority): set at submission, never changed.
    priority = models.CharField(max_length=8, choices=Priority.choices,
                                default=Priority.STANDARD)
    # A flex job still unfinished FLEX_PROMOTE_AFTER after its approval is promoted: its
    # chunks are dispatched as standard ones from then on, its price unchanged
    # (docs/dev/decisions/2026-12-06-urgency-tiers.md). When; null while it is not.
    promoted_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=16, choices=JobStatus.choices,
                              default=JobStatus.SUBMITTED, db_index=True)
    # The internal step of its status the job is in (jobs.constants.JobSubstate: the
    # sampling wait of estimating), blank for the status itself. Written with status, by
    # job_transition alone; no customer sees it.
    substate = models.CharField(max_length=16, choices=JobSubstate.choices, blank=True,
                                default="")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by_key = models.ForeignKey(
        "console.ApiKey", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    # The lease on the work the job's status waits for (its estimate, its sample, its
    # start, its finalize): when it was last handed out, whether a worker has taken it, and
    # how many times the recovery pass has had to hand it out again. Every transition resets
    # them; jobs.services.recovery reads them (docs/dev/decisions/2026-12-01-job-lifecycle.md).
    leased_at = models.DateTimeField(default=timezone.now)
    claimed = models.BooleanField(default=False)
    attempts = models.PositiveSmallIntegerField(default=0)
    cost_ready_at = models.DateTimeField(null=True, blank=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    # The submit's fields as given (the *_requested ones) and as in force: an estimate
    # fills max_output_tokens / reasoning_budget when the caller left them out.
    max_output_tokens_requested = models.PositiveIntegerField(null=True, blank=True)
    max_output_tokens = models.PositiveIntegerField(null=True, blank=True)
    max_tokens_alias = models.BooleanField(
        default=False, help_text="Submitted as max_tokens, the former name; echoed back.")
    reasoning = models.BooleanField(null=True, blank=True)
    reasoning_budget_requested = models.PositiveIntegerField(null=True, blank=True)
    reasoning_budget = models.PositiveIntegerField(null=True, blank=True)
    reasoning_effort = models.CharField(max_length=16, blank=True, default="")
    response_format = models.JSONField(null=True, blank=True)
    dimensions = models.PositiveIntegerField(null=True, blank=True)
    video_fps = models.FloatField(null=True, blank=True)

    est_input_tok = models.PositiveBigIntegerField(null=True, blank=True)
    est_output_tok = models.PositiveBigIntegerField(null=True, blank=True)
    est_processing_seconds = models.PositiveIntegerField(null=True, blank=True)
    # What the estimate's read found of the work rows share (jobs.validation.grouping):
    # the share of the chat rows' prompt bytes that the row before it in the planned order
    # already held, and the rows that repeat an earlier row but for custom_id. Null where
    # not computed (a parquet input, grouping off, an input too large to key).
    est_shared_prefix_share = models.FloatField(null=True, blank=True)
    est_identical_rows = models.PositiveIntegerField(null=True, blank=True)
    # The input usage the rows were counted to (inference.pricing.Usage, output excluded),
    # media kept apart, so the sampled estimate prices media at the media rates and adds
    # the per-item and per-minute charges (docs/dev/decisions/2026-12-01-credits-and-billing.md).
    est_usage = models.JSONField(null=True, blank=True)
    # The sampled estimate's tokens (prompt and generated), reserved when it is queued and
    # replaced by what it used; they count against the organization's hourly allowance of
    # sampled tokens from sampled_at (jobs.services.sampling).
    sample_tokens = models.PositiveBigIntegerField(null=True, blank=True)
    sampled_at = models.DateTimeField(null=True, blank=True)
    # The rows the sampled estimate runs, picked where the input was read while estimating:
    # [[row index, byte start, byte end], ...] (a parquet input's: [[row index], ...]), so
    # the GPU worker reads those rows alone (jobs.services.sampling).
    sample_rows = models.JSONField(null=True, blank=True)
    row_count = models.PositiveIntegerField(null=True, blank=True)
    success_rows = models.PositiveIntegerField(null=True, blank=True)
    error_rows = models.PositiveIntegerField(null=True, blank=True)
    format_error_rows = models.PositiveIntegerField(null=True, blank=True)
    truncated_rows = models.PositiveIntegerField(null=True, blank=True)
    pending_rows = models.PositiveIntegerField(null=True, blank=True)
    partial = models.BooleanField(null=True, blank=True)
    data_expires_at = models.DateTimeField(null=True, blank=True)
    data_deleted_at = models.DateTimeField(null=True, blank=True)
    # DELETE /jobs/{id}/data on a job in flight: purge once it has stopped.
    data_delete_requested = models.BooleanField(default=False)
    # Cancel reached it while rows were running: it settles as cancelled when they finish.
    cancel_requested = models.BooleanField(default=False)
    result_key = models.CharField(max_length=500, blank=True, default="")
    # Recorded once, when the job ends (jobs.services.running job_finalize, job_transition):
    # what its done chunks consumed (inference.pricing.Usage as usage_json writes it), and
    # the bytes of its JSONL result's lines with no error and with one - the OpenAI
    # surface's output and error files - so a read never sums the chunks or reads the file.
    usage = models.JSONField(null=True, blank=True)
    result_output_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    result_error_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # Where every results.LINE_MARK_EVERY-th line of its JSONL result starts (ResultWritten),
    # so a page of its rows (GET /jobs/{id}/rows) reads from the mark before it.
    result_line_marks = ArrayField(models.BigIntegerField(), null=True, blank=True)
    # Who approved it: the key (or console user) whose spend this job is.
    approved_by_key = models.ForeignKey(
        "console.ApiKey", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
        related_name="+",
    )
    est_cost_cents = models.PositiveBigIntegerField(null=True, blank=True)
    cost_cents = models.PositiveBigIntegerField(null=True, blank=True)
    failure_code = models.CharField(max_length=32, choices=FailureCode.choices, blank=True,
                                    default="")
    failure_reason = models.TextField(blank=True, default="")
    # A re-run (POST /jobs/{id}/rerun): the job whose rows it runs again, and which of
    # their outcomes were picked (RowOutcome values). Its input is exactly those rows of
    # the parent's, in the parent's order: the merged result lines them up by that order
    # (jobs.services.rerun).
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="children")
    rerun_include = models.JSONField(null=True, blank=True)
    # A GET ?merged=true writing this job's merged result holds this claim (a conditional
    # UPDATE), renewed as its rows go by, so concurrent first requests write it once: the
    # others wait for it (jobs.services.rerun). Null when no one is writing it.
    merge_claimed_at = models.DateTimeField(null=True, blank=True)
    # The highest progress threshold (percent of rows) whose webhook was recorded: each is
    # sent once, whichever chunk (or re-run of one) crosses it (jobs.services.progress).
    progress_sent = models.PositiveSmallIntegerField(default=0)
    # The job's policy, set by whoever submits it (jobs.services.submission job_submit; the
    # OpenAI surface sets all three, docs/openai.md) and read by the state machine and the
    # estimate, which never ask which surface a job came from:
    # - approve_at_estimate: no approval step. It is approved for the submitting key as
    #   soon as it is priced, or cancelled unbilled when it cannot be (failure_code
    #   insufficient_credits or not_approved); a cancel before then is kept until it is
    #   priced (jobs.services.lifecycle job_cost_ready, job_cancel).
    # - collect_row_errors: its estimate reads on past a failing row and keeps every one
    #   in input_errors, failing the job on the first (a preflight check's mode).
    # - row_model: every row's body.model must name the job's model (JobOptions.row_model).
    approve_at_estimate = models.BooleanField(default=False)
    collect_row_errors = models.BooleanField(default=False)
    row_model = models.BooleanField(default=False)
    # The rows its estimate refused, in file order, at most INPUT_ERRORS_MAX:
    # [{"line", "custom_id", "code", "message"}] (a job that collects them).
    input_errors = models.JSONField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["organization", "status"]),
                   # The hourly sample allowance sums an organization's recent samples.
                   models.Index(fields=["organization", "sampled_at"]),
                   # GET /metrics (anex/metrics.py): the jobs ended since its last scrape,
                   # and the unfinished ones by status, without reading every job.
                   models.Index(fields=["finished_at"], name="job_finished_at",
                                condition=models.Q(finished_at__isnull=False)),
                   models.Index(fields=["status"], name="job_unfinished_status",
                                condition=~models.Q(status__in=sorted(TERMINAL_STATUSES)))]
        constraints = [
            # A substate is only ever held beside the status it belongs to.
            models.CheckConstraint(
                condition=functools.reduce(operator.or_, (
                    models.Q(substate=substate, status=status)
                    for substate, status in SUBSTATE_OF.items()), models.Q(substate="")),
                name="job_substate_of_its_status"),
        ]

    def __str__(self) -> str:
        return f"{self.model} job {self.pk} ({self.status})"

    @property
    def dispatch_tier(self) -> str:
        """The tier its chunks are dispatched in: its priority, or standard once promoted."""
        return dispatch_tier(self.priority, self.promoted_at)

    @property
    def state(self) -> JobState:
        """The state machine's state: the status, or the substate of it the job is in."""
        return job_state(self.status, self.substate)

    def options(self) -> JobOptions:
        """The job's model and job-level fields as they were requested (an estimate fills
        max_output_tokens / reasoning_budget in force, never these)."""
        return JobOptions(
            model=self.model, max_output_tokens=self.max_output_tokens_requested,
            max_tokens_alias=self.max_tokens_alias, reasoning=self.reasoning,
            reasoning_budget=self.reasoning_budget_requested,
            reasoning_effort=self.reasoning_effort or None,
            response_format=self.response_format, dimensions=self.dimensions,
            video_fps=self.video_fps, row_model=self.row_model)

    @staticmethod
    def options_columns(options: JobOptions, *, generates: bool) -> dict[str, Any]:
        """The columns a new job stores `options` in (Job.options() reads them back): the
        cap in force starts as the one requested, and a kind that generates nothing has
        none (0)."""
        return {
            "model": options.model,
            "max_output_tokens_requested": options.max_output_tokens,
            "max_output_tokens": options.max_output_tokens if generates else 0,
            "max_tokens_alias": options.max_tokens_alias,
            "reasoning": options.reasoning,
            "reasoning_budget_requested": options.reasoning_budget,
            "reasoning_budget": options.reasoning_budget,
            "reasoning_effort": options.reasoning_effort or "",
            "response_format": options.response_format,
            "dimensions": options.dimensions,
            "video_fps": options.video_fps,
            "row_model": options.row_model,
        }


JOB_STATE_CHOICES = JobStatus.choices + JobSubstate.choices


class JobEvent(models.Model):
    """One move of a job's state (a status, or a substate of one), written in the commit
    that makes it (append-only)."""

    id = models.BigAutoField(primary_key=True)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    # States of the machine (jobs.constants.JobState): a status, or a substate of one, so
    # entering and leaving the sampling wait are events too. Blank for the job's creation.
    from_status = models.CharField(max_length=16, choices=JOB_STATE_CHOICES, blank=True)
    to_status = models.CharField(max_length=16, choices=JOB_STATE_CHOICES)
    at = models.DateTimeField(default=timezone.now)
    # Who moved it, as console.actors.Actor.label reads: "key ...", "user ...", "system: ...".
    actor_label = models.CharField(max_length=255)

    class Meta:
        ordering = ["job", "id"]

    def __str__(self) -> str:
        return f"job {self.job_id}: {self.from_status or '-'} -> {self.to_status}"


class Input(models.Model):
    """An input file: uploaded straight to storage, or copied in from a customer URL."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "console.Organization", on_delete=models.PROTECT, related_name="inputs"
    )
    status = models.CharField(max_length=16, choices=InputStatus.choices, db_index=True)
    format = models.CharField(max_length=8, choices=InputFormat.choices)
    data_residency = models.CharField(max_length=8, choices=Region.choices)
    object_key = models.CharField(max_length=500)
    input_s3_uri = models.CharField(max_length=600, unique=True)
    # Ingest mode only. The source URL may carry the customer's presigned credentials, so
    # it is kept only until the copy settles, and never logged.
    source_url = models.TextField(blank=True, default="")
    callback_url = models.URLField(max_length=2000, blank=True, default="")
    callback_secret_encrypted = models.TextField(blank=True, default="")
    error = models.TextField(blank=True, default="")
    size_bytes = models.PositiveBigIntegerField(null=True, blank=True)
    # The exact bytes that became ready (jobs.storage fingerprint: an S3 VersionId or ETag,
    # a local SHA-256): every read of the input is pinned to them, so a file swapped under
    # the same key later (a replayed upload form) is refused, never run or billed.
    content_pin = models.CharField(max_length=300, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    created_by_key = models.ForeignKey(
        "console.ApiKey", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    upload_expires_at = models.DateTimeField(null=True, blank=True)
    copy_started_at = models.DateTimeField(null=True, blank=True)
    # Copies started: one whose worker keeps dying fails past INGEST_ATTEMPTS.
    attempts = models.PositiveSmallIntegerField(default=0)
    ready_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"input {self.pk} ({self.status})"


class WebhookDelivery(models.Model):
    """One signed POST to deliver, kept until delivered or given up: the outbox that makes
    a lost queue message harmless (a sweeper re-sends what is due)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "console.Organization", on_delete=models.PROTECT, related_name="webhook_deliveries"
    )
    # The ingest this callback reports on; its own callback secret signs it.
    input = models.ForeignKey(Input, null=True, blank=True, on_delete=models.CASCADE,
                              related_name="callbacks")
    # The job this event reports on: its events are delivered in the order recorded, and
    # a result link is made for it at each attempt.
    job = models.ForeignKey(Job, null=True, blank=True, on_delete=models.CASCADE,
                            related_name="webhook_deliveries")
    url = models.URLField(max_length=2000)
    event_type = models.CharField(max_length=64)
    payload = models.JSONField()
    status = models.CharField(max_length=16, choices=DeliveryStatus.choices,
                              default=DeliveryStatus.PENDING, db_index=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=True)
    leased_until = models.DateTimeField(null=True, blank=True)
    last_status_code = models.PositiveIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=500, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name_plural = "webhook deliveries"

    def __str__(self) -> str:
        return f"{self.event_type} to {self.url} ({self.status})"


class Chunk(models.Model):
    """A slice of a job's rows run in one engine call. Its results are one object in
    storage keyed by the chunk, so a re-run overwrites and never duplicates, and its counts
    and usage are recorded once, by the guarded move to done."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="chunks")
    index = models.PositiveIntegerField()
    first_row = models.PositiveIntegerField()
    row_count = models.PositiveIntegerField()
    # JSONL inputs: the chunk's lines are these bytes of the input object.
    byte_start = models.PositiveBigIntegerField(null=True, blank=True)
    byte_end = models.PositiveBigIntegerField(null=True, blank=True)
    # A grouped plan's chunk (ChunkPlan.row_order): its rows are not one range but these,
    # flat [row index, byte start, byte end, ...] in the order they run; first_row is then
    # its place in the planned order. Null for a contiguous chunk (byte_start, byte_end).
    spans = ArrayField(models.BigIntegerField(), null=True, blank=True)
    status = models.CharField(max_length=8, choices=ChunkStatus.choices,
                              default=ChunkStatus.PENDING, db_index=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    # Runs that failed for the infrastructure or the engine, not the chunk (jobs.failures):
    # each gave its attempt back and waited longer; past a cap they count as attempts.
    deferrals = models.PositiveSmallIntegerField(default=0)
    # Runs that ended with the engine failing after it had been answering (the chunk's rows
    # may be what brought it down): the first is the engine's, a second the chunk's
    # (jobs.services.running, docs/dev/decisions/2026-12-02-failure-classes-and-the-breaker.md).
    engine_failures = models.PositiveSmallIntegerField(default=0)
    # When its message was last sent: a pending chunk whose message a dead worker had
    # taken is sent again once this is stale.
    queued_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Its first claim (kept through a requeue): a job's queue wait, approval to its first
    # chunk running, is read from it (anex/metrics.py).
    started_at = models.DateTimeField(null=True, blank=True)
    success_rows = models.PositiveIntegerField(default=0)
    error_rows = models.PositiveIntegerField(default=0)
    format_error_rows = models.PositiveIntegerField(default=0)
    truncated_rows = models.PositiveIntegerField(default=0)
    # What the chunk's billable rows consumed, as inference.pricing.Usage fields.
    usage = models.JSONField(default=dict, blank=True)
    # Its failed rows by error ({jobs.services.outcomes.error_key: rows}), recorded with its
    # counts by the move to done: the console's outcome breakdown sums them, and a page of
    # one error's rows reads only the chunks that have it.
    error_codes = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["job", "index"]
        constraints = [
            models.UniqueConstraint(fields=["job", "index"], name="chunk_unique_index"),
        ]
        indexes = [
            # Fair dispatch counts, at every chunk's end, the chunks in flight and waiting
            # per job (jobs.services.chunks.chunks_release): only the unsettled ones, a
            # few per running job, however many millions have settled.
            models.Index(fields=["job", "status", "index"], name="chunk_unsettled",
                         condition=models.Q(status__in=["pending", "running"])),
        ]

    def __str__(self) -> str:
        return f"chunk {self.index} of job {self.job_id} ({self.status})"


class ChunkPlan(models.Model):
    """Where a JSONL job's chunks lie in its input, recorded by its estimate's read of the
    input (jobs.validation.layout), so the start plans its chunks without reading the input
    again (jobs.services.running.chunks_plan;
    docs/dev/decisions/2026-12-06-one-read-of-the-input.md). A row of its own, apart from
    the job's, which every chunk run loads: a large input's plan is thousands of offsets."""

    job = models.OneToOneField(Job, primary_key=True, on_delete=models.CASCADE,
                               related_name="chunk_plan")
    # The chunk size it was planned at (ANEX_CHUNK_ROWS then): a start under another size
    # plans by reading, as for a job estimated before plans were kept.
    chunk_rows = models.PositiveIntegerField()
    # The byte of the frozen input each chunk ends at (its last newline included), in
    # order: the k-th chunk holds rows k * chunk_rows onward, from the end before it.
    chunk_ends = ArrayField(models.PositiveBigIntegerField())
    # A grouped plan (jobs.validation.grouping): the row indexes in the order they run
    # (little-endian uint32) and every row's first byte, then the file's end (little-endian
    # uint64), so the start cuts chunks of consecutive planned rows and names each row's
    # bytes. Null for a contiguous plan, which chunk_ends says whole. A few MB for a
    # million rows: kept here, off the job's row, read by the start alone.
    row_order = models.BinaryField(null=True, blank=True)
    row_starts = models.BinaryField(null=True, blank=True)

    def __str__(self) -> str:
        return f"chunk plan of job {self.job_id} ({len(self.chunk_ends)} chunks)"


class IdempotencyRecord(models.Model):
    """The response a POST with an Idempotency-Key gave, kept 24 hours so that the same
    key and body replay it (jobs.idempotency). Written in the transaction that does
    the request's work, so a record exists only for work that was committed."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(
        "console.Organization", on_delete=models.CASCADE, related_name="+"
    )
    key = models.CharField(max_length=255)
    # SHA-256 of the method, the path and the canonical JSON body: another endpoint or
    # body under the same key is refused, never answered with this response.
    fingerprint = models.CharField(max_length=64)
    # Null only inside the request's own transaction, which no other request sees.
    status_code = models.PositiveSmallIntegerField(null=True)
    # The response body's JSON, encrypted (anex.crypto): an ingest's answer carries its
    # callback secret, an upload target its signed form.
    body_encrypted = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(db_index=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            # The lock a concurrent duplicate waits on: its insert blocks until the first
            # request's transaction ends.
            models.UniqueConstraint(fields=["organization", "key"],
                                    name="idempotency_unique_key"),
        ]

    def __str__(self) -> str:
        return f"idempotency key {self.key!r} ({self.status_code})"


class PreflightCheck(models.Model):
    """POST /checks: an input's rows checked for a model and a job's fields as a job's
    estimate checks them, collecting every failing row (up to CHECK_ERRORS_MAX) instead
    of stopping at the first. Free: no job, no approval slot, no hold
    (jobs.services.checks)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "console.Organization", on_delete=models.PROTECT, related_name="checks"
    )
    input = models.ForeignKey(Input, on_delete=models.PROTECT, related_name="checks")
    created_by_key = models.ForeignKey(
        "console.ApiKey", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    model = models.CharField(max_length=100)
    # The job fields the rows are checked against, as submit would take them.
    options = models.JSONField(default=dict, blank=True)
    status = models.CharField(max_length=16, choices=CheckStatus.choices,
                              default=CheckStatus.CHECKING)
    row_count = models.PositiveIntegerField(null=True, blank=True)
    est_input_tok = models.PositiveBigIntegerField(null=True, blank=True)
    error_count = models.PositiveIntegerField(null=True, blank=True)
    # [{"line", "custom_id", "reason"}], at most CHECK_ERRORS_MAX, in file order.
    errors = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"check {self.pk} of input {self.input_id} ({self.status})"


class WorkerHeartbeat(models.Model):
    """A Dramatiq worker process that is (or was lately) alive: written by the worker
    itself every few seconds (jobs.services.workers), read by the admin's operations page.
    One row a process, updated in place and deleted when it stops; a row whose beat is old
    is a worker that died without saying so."""

    name = models.CharField(max_length=200, unique=True)  # "host:pid"
    hostname = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)
    # What it serves: model ids and regions (ANEX_WORKER_*), the queues it consumes, and
    # the model ids whose engine it has loaded.
    served_models = models.JSONField(default=list)
    regions = models.JSONField(default=list)
    queues = models.JSONField(default=list)
    engines_loaded = models.JSONField(default=list)

    class Meta:
        ordering = ["hostname", "pid"]

    def __str__(self) -> str:
        return f"worker {self.name}"
