from django.db import models


class JobStatus(models.TextChoices):
    """The lifecycle (DECISIONS.md, "Job lifecycle")."""

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
