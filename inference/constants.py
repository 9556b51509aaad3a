"""The model-side vocabulary the task kinds and the job pipeline share."""

from django.db import models


class InputFormat(models.TextChoices):
    JSONL = "jsonl"
    PARQUET = "parquet"


class RowOutcome(models.TextChoices):
    """How one row ended, as the chunk results record it (and the job's counts sum)."""

    SUCCESS = "success"
    ERROR = "error"
    TRUNCATED = "truncated"  # stopped on the output-token cap
    FORMAT_ERROR = "format_error"  # could not satisfy its response_format
