from django.db import models


class JobStatus(models.TextChoices):
    """The lifecycle (docs/decisions.md, "Job lifecycle")."""

    SUBMITTED = "submitted"
    ESTIMATING = "estimating"
    COST_READY = "cost_ready"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    DONE = "done"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


TERMINAL_STATUSES = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED})


class TaskType(models.TextChoices):
    CHAT = "chat"
    EMBED = "embed"
    DECIDE = "decide"


# Jobs that count against the organization's approval queue (the reference: "at most 10
# jobs awaiting approval").
AWAITING_APPROVAL_STATUSES = frozenset({JobStatus.SUBMITTED, JobStatus.ESTIMATING,
                                        JobStatus.COST_READY})


class FailureCode(models.TextChoices):
    INVALID_INPUT = "invalid_input"
    INTERNAL_ERROR = "internal_error"


class InputStatus(models.TextChoices):
    """An input's life (the reference's POST /inputs and GET /inputs/{id})."""

    AWAITING_UPLOAD = "awaiting_upload"
    PENDING = "pending"
    COPYING = "copying"
    READY = "ready"
    FAILED = "failed"
    EXPIRED = "expired"


class InputFormat(models.TextChoices):
    JSONL = "jsonl"
    PARQUET = "parquet"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    GAVE_UP = "gave_up"


# Seconds between webhook delivery attempts: widening, about a day in all (the reference:
# "retried on a widening backoff for about a day, then given up").
DELIVERY_BACKOFF_SECONDS = (5, 60, 300, 1800, 7200, 18000, 36000, 21600)


class ChunkStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # its engine call kept failing: the job ends with what else finished
    SKIPPED = "skipped"  # never started: the job was cancelled first


CHUNK_SETTLED = frozenset({ChunkStatus.DONE, ChunkStatus.FAILED, ChunkStatus.SKIPPED})


class RowOutcome(models.TextChoices):
    """How one row ended, as the chunk results record it (and the job's counts sum)."""

    SUCCESS = "success"
    ERROR = "error"
    TRUNCATED = "truncated"  # stopped on the output-token cap
    FORMAT_ERROR = "format_error"  # could not satisfy its response_format
