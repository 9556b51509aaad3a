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


class FailureCode(models.TextChoices):
    INVALID_INPUT = "invalid_input"
    INTERNAL_ERROR = "internal_error"
