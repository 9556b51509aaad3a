"""The OpenAI surface's own records: the names OpenAI's objects carry that anex's do not
(a file's id, name and purpose; a batch's id, endpoint, window and metadata), each bound
to the anex object it stands for. No status lives here: a batch's status is its job's
(openai_api.batches), a file's bytes are its input's or its job's result's."""

from __future__ import annotations

import secrets

from django.db import models

from console.tenancy import OrgScopedQuerySet


def file_id_new() -> str:
    return f"file-{secrets.token_hex(12)}"


def batch_id_new() -> str:
    return f"batch_{secrets.token_hex(12)}"


class FilePurpose(models.TextChoices):
    BATCH = "batch"  # an uploaded input
    BATCH_OUTPUT = "batch_output"  # a batch's output or error file


class FilePart(models.TextChoices):
    """What a batch_output file holds of its job's one result file."""

    OUTPUT = "output"  # the rows that succeeded (error null)
    ERROR = "error"  # the rows that failed


class OpenAIFile(models.Model):
    """A file as OpenAI names it: an anex input (purpose batch), or one part of a batch's
    result (purpose batch_output)."""

    id = models.CharField(primary_key=True, max_length=40, default=file_id_new,
                          editable=False)
    organization = models.ForeignKey("console.Organization", on_delete=models.PROTECT,
                                     related_name="+")
    purpose = models.CharField(max_length=16, choices=FilePurpose.choices)
    filename = models.CharField(max_length=255)
    input = models.OneToOneField("jobs.Input", null=True, blank=True,
                                 on_delete=models.PROTECT, related_name="openai_file")
    batch = models.ForeignKey("openai_api.OpenAIBatch", null=True, blank=True,
                              on_delete=models.CASCADE, related_name="files")
    part = models.CharField(max_length=8, choices=FilePart.choices, blank=True, default="")
    bytes = models.PositiveBigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)
    # DELETE /files/{id}: gone from the surface at once.
    deleted_at = models.DateTimeField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["batch", "part"], name="openai_file_one_part",
                                    condition=models.Q(batch__isnull=False)),
        ]

    def __str__(self) -> str:
        return f"{self.id} ({self.purpose})"


class OpenAIBatch(models.Model):
    """A batch as OpenAI names it, over one anex job. `job` is null only for a batch that
    failed before a job could exist (its file names no usable model): `errors` says why."""

    id = models.CharField(primary_key=True, max_length=40, default=batch_id_new,
                          editable=False)
    organization = models.ForeignKey("console.Organization", on_delete=models.PROTECT,
                                     related_name="+")
    job = models.OneToOneField("jobs.Job", null=True, blank=True, on_delete=models.PROTECT,
                               related_name="openai_batch")
    input_file = models.ForeignKey(OpenAIFile, on_delete=models.PROTECT, related_name="+")
    endpoint = models.CharField(max_length=64)
    completion_window = models.CharField(max_length=8, default="24h")
    metadata = models.JSONField(null=True, blank=True)
    # Why it failed before a job existed: [{"code", "line", "message", "param"}].
    errors = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    cancelling_at = models.DateTimeField(null=True, blank=True)
    # Past its completion window (openai_api.batches.batches_expire): when its job was
    # cancelled for it. The batch reads `expired` once that job has stopped.
    expired_at = models.DateTimeField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.id} (job {self.job_id})"
