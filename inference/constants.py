"""The model-side vocabulary the task kinds and the job pipeline share."""

from django.db import models

# The reference's output ceiling: max_output_tokens is 1-32,768 and reasoning_budget
# 0-32,768 (the API's serializer and the console's form), and a sample generates under it
# when neither the job nor the model sets a lower cap (jobs.services.sampling).
MAX_OUTPUT_TOKENS = 32_768


class InputFormat(models.TextChoices):
    JSONL = "jsonl"
    PARQUET = "parquet"


class RowOutcome(models.TextChoices):
    """How one row ended, as the chunk results record it (and the job's counts sum)."""

    SUCCESS = "success"
    ERROR = "error"
    TRUNCATED = "truncated"  # stopped on the output-token cap
    FORMAT_ERROR = "format_error"  # could not satisfy its response_format
