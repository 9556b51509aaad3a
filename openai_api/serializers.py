"""The OpenAI surface's bodies: what a create takes (shape only: the rules are
openai_api.batches'), and OpenAI's objects as OpenAPI documents them. The views answer
with the objects openai_api.batches builds; these say what they hold."""

from __future__ import annotations

from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers

from openai_api.batches import (
    COMPLETION_WINDOW_INVALID,
    COMPLETION_WINDOWS,
    ENDPOINTS,
    METADATA_KEY_CHARS,
    METADATA_PAIRS,
    METADATA_VALUE_CHARS,
)

BATCH_STATUSES = ("validating", "failed", "in_progress", "finalizing", "completed", "expired",
                  "cancelling", "cancelled")


class BatchCreateIn(serializers.Serializer[dict[str, Any]]):
    input_file_id = serializers.CharField(max_length=40)
    endpoint = serializers.ChoiceField(choices=ENDPOINTS)
    completion_window = serializers.ChoiceField(
        choices=tuple(COMPLETION_WINDOWS),
        error_messages={"invalid_choice": COMPLETION_WINDOW_INVALID},
        help_text="24h (the standard tier) or 72h (anex's flex tier: half price, run on "
                  "spare capacity); metadata anex_priority (flex, standard, priority) names "
                  "the tier outright. docs/openai.md.")
    metadata = serializers.DictField(child=serializers.CharField(max_length=METADATA_VALUE_CHARS,
                                                     allow_blank=True, trim_whitespace=False),
                         allow_null=True, required=False, allow_empty=True,
                         help_text=f"Up to {METADATA_PAIRS} pairs; keys up to "
                                   f"{METADATA_KEY_CHARS} characters, values up to "
                                   f"{METADATA_VALUE_CHARS}.")
    output_expires_after = serializers.JSONField(
        required=False, allow_null=True,
        help_text="Accepted and not applied: output files are kept as long as the job's "
                  "result (30 days).")

    def validate_metadata(self, value: dict[str, str] | None) -> dict[str, str] | None:
        # Kept as given, in PostgreSQL's jsonb, which stores no NUL: a key holding one is
        # refused as a value holding one is (the child CharField), rather than a 500.
        if value is not None and any("\x00" in key for key in value):
            raise serializers.ValidationError(ProhibitNullCharactersValidator.message)
        return value


class FileUploadIn(serializers.Serializer[dict[str, Any]]):
    purpose = serializers.ChoiceField(choices=("batch",))
    file = serializers.FileField(help_text="The JSONL input, streamed to storage; up to the "
                                           "input cap.")


class FileOut(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=("file",))
    bytes = serializers.IntegerField()
    created_at = serializers.IntegerField()
    filename = serializers.CharField()
    purpose = serializers.ChoiceField(choices=("batch", "batch_output"))
    status = serializers.ChoiceField(choices=("processed",))
    expires_at = serializers.IntegerField(allow_null=True)
    status_details = serializers.CharField(allow_null=True)


class FileListOut(serializers.Serializer[dict[str, Any]]):
    object = serializers.ChoiceField(choices=("list",))
    data = FileOut(many=True)  # type: ignore[assignment]  # a field, not .data
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


class FileDeletedOut(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=("file",))
    deleted = serializers.BooleanField()


class BatchErrorOut(serializers.Serializer[dict[str, Any]]):
    code = serializers.CharField()
    line = serializers.IntegerField(allow_null=True)
    message = serializers.CharField()
    param = serializers.CharField(allow_null=True)


class BatchErrorsOut(serializers.Serializer[dict[str, Any]]):
    object = serializers.ChoiceField(choices=("list",))
    data = BatchErrorOut(many=True)  # type: ignore[assignment]  # a field, not .data


class RequestCountsOut(serializers.Serializer[dict[str, Any]]):
    total = serializers.IntegerField()
    completed = serializers.IntegerField()
    failed = serializers.IntegerField()


class _CachedOut(serializers.Serializer[dict[str, Any]]):
    cached_tokens = serializers.IntegerField()


class _ReasoningOut(serializers.Serializer[dict[str, Any]]):
    reasoning_tokens = serializers.IntegerField()


class BatchUsageOut(serializers.Serializer[dict[str, Any]]):
    input_tokens = serializers.IntegerField()
    input_tokens_details = _CachedOut()
    output_tokens = serializers.IntegerField()
    output_tokens_details = _ReasoningOut()
    total_tokens = serializers.IntegerField()


class BatchOut(serializers.Serializer[dict[str, Any]]):
    id = serializers.CharField()
    object = serializers.ChoiceField(choices=("batch",))
    endpoint = serializers.CharField()
    errors = BatchErrorsOut(allow_null=True)  # type: ignore[assignment]  # a field
    input_file_id = serializers.CharField()
    completion_window = serializers.CharField()
    status = serializers.ChoiceField(choices=BATCH_STATUSES)
    output_file_id = serializers.CharField(allow_null=True)
    error_file_id = serializers.CharField(allow_null=True)
    created_at = serializers.IntegerField()
    in_progress_at = serializers.IntegerField(allow_null=True)
    expires_at = serializers.IntegerField(allow_null=True)
    finalizing_at = serializers.IntegerField(allow_null=True)
    completed_at = serializers.IntegerField(allow_null=True)
    failed_at = serializers.IntegerField(allow_null=True)
    expired_at = serializers.IntegerField(allow_null=True)
    cancelling_at = serializers.IntegerField(allow_null=True)
    cancelled_at = serializers.IntegerField(allow_null=True)
    request_counts = RequestCountsOut()
    metadata = serializers.DictField(child=serializers.CharField(), allow_null=True)
    model = serializers.CharField(allow_null=True)
    usage = BatchUsageOut(allow_null=True)
    anex_job_id = serializers.UUIDField(allow_null=True, help_text=(
        "anex's own: the job behind the batch (GET /batch/v1/jobs/{id}); null for a "
        "batch that failed before a job existed."))


class BatchListOut(serializers.Serializer[dict[str, Any]]):
    object = serializers.ChoiceField(choices=("list",))
    data = BatchOut(many=True)  # type: ignore[assignment]  # a field, not .data
    first_id = serializers.CharField(allow_null=True)
    last_id = serializers.CharField(allow_null=True)
    has_more = serializers.BooleanField()


class OpenAIErrorBodyOut(serializers.Serializer[dict[str, Any]]):
    message = serializers.CharField()
    type = serializers.CharField()
    code = serializers.CharField(allow_null=True)
    param = serializers.CharField(allow_null=True)


class OpenAIErrorOut(serializers.Serializer[dict[str, Any]]):
    error = OpenAIErrorBodyOut()

