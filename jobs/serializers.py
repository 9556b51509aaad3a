"""The batch API's wire shapes: input serializers check shape only (a missing or wrongly
typed field is 422); the reference's 400 rules are the services' and views' to raise."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from rest_framework import serializers

from anex.regions import Region
from inference.catalog import model_get
from inference.constants import RowOutcome
from jobs.constants import RERUN_OUTCOMES, CheckStatus, InputStatus, JobStatus
from jobs.models import Input, Job, PreflightCheck


def utc_iso(moment: datetime | None) -> str | None:
    """The reference's timestamp shape: 2026-07-26T15:04:05Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


class InputCreateIn(serializers.Serializer):
    source_url = serializers.CharField(required=False, max_length=8192)
    format = serializers.CharField(required=False, max_length=32)
    callback_url = serializers.CharField(required=False, max_length=2000)
    data_residency = serializers.ChoiceField(choices=Region.values, required=False)


# Response schemas for the two creation modes, as OpenAPI (an upload's "fields" cannot be
# a serializer field: it would shadow Serializer.fields).
INPUT_UPLOAD_SCHEMA = {
    "type": "object",
    "required": ["id", "status", "upload_url", "fields", "expires_at", "input_s3_uri"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "status": {"type": "string", "enum": ["awaiting_upload"]},
        "upload_url": {"type": "string", "format": "uri"},
        "fields": {"type": "object", "additionalProperties": {"type": "string"},
                   "description": "Send every entry as a form field, then the file, last."},
        "expires_at": {"type": "string", "format": "date-time"},
        "input_s3_uri": {"type": "string"},
    },
}
INPUT_INGEST_SCHEMA = {
    "type": "object",
    "required": ["id", "status", "input_s3_uri"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "status": {"type": "string", "enum": ["pending"]},
        "input_s3_uri": {"type": "string"},
        "callback_secret": {"type": "string",
                            "description": "Only with a callback_url; shown this once."},
    },
}


class InputOut(serializers.ModelSerializer[Input]):
    error = serializers.SerializerMethodField()
    expires_at = serializers.SerializerMethodField()

    class Meta:
        model = Input
        fields = ["id", "status", "format", "data_residency", "input_s3_uri", "error",
                  "expires_at", "size_bytes", "created_at"]

    def get_error(self, item: Input) -> str | None:
        return item.error or None

    def get_expires_at(self, item: Input) -> str | None:
        """The upload window while awaiting the upload; the retention deadline while ready."""
        if item.status == InputStatus.AWAITING_UPLOAD:
            return utc_iso(item.upload_expires_at)
        if item.status == InputStatus.READY:
            return utc_iso(item.expires_at)
        return None


def utc_offset_iso(moment: datetime | None) -> str | None:
    """The reference's job timestamps: 2026-07-24T10:30:00+00:00."""
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment else None


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: not a string of digits, not a boolean, not 1.0."""

    def to_internal_value(self, data: object) -> int:
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)  # type: ignore[no-any-return]


class StrictBooleanField(serializers.BooleanField):
    """A JSON boolean: true or false, nothing that merely looks like one."""

    def to_internal_value(self, data: object) -> bool:
        if not isinstance(data, bool):
            self.fail("invalid", input=data)
        return data


class StrictNumberField(serializers.FloatField):
    def to_internal_value(self, data: object) -> float:
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return float(data)  # type: ignore[arg-type]


class JobCreateIn(serializers.Serializer):
    input_id = serializers.CharField(required=False, allow_null=True, max_length=100)
    input_s3_uri = serializers.CharField(required=False, allow_null=True, max_length=600)
    model = serializers.CharField(max_length=100)
    max_output_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1,
                                           max_value=32_768)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1,
                                    max_value=32_768,
                                    help_text="The former name of max_output_tokens.")
    reasoning = StrictBooleanField(required=False, allow_null=True)
    reasoning_budget = StrictIntegerField(required=False, allow_null=True, min_value=0,
                                          max_value=32_768)
    reasoning_effort = serializers.CharField(required=False, allow_null=True, max_length=32)
    video_fps = StrictNumberField(required=False, allow_null=True)
    response_format = serializers.JSONField(required=False, allow_null=True)
    dimensions = StrictIntegerField(required=False, allow_null=True, min_value=1)
    data_residency = serializers.ChoiceField(choices=Region.values, required=False,
                                             allow_null=True)

    def validate_response_format(self, value: Any) -> Any:
        # Kept as given, in PostgreSQL's jsonb, which stores no NUL: refused as every
        # string field of this body refuses one (DRF's CharField), rather than a 500.
        if _holds_nul(value):
            raise serializers.ValidationError(ProhibitNullCharactersValidator.message)
        return value

    def validate_video_fps(self, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise serializers.ValidationError("video_fps must be a number above 0.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if (attrs.get("input_id") is None) == (attrs.get("input_s3_uri") is None):
            raise serializers.ValidationError("Give exactly one of input_id / input_s3_uri.")
        new, old = attrs.get("max_output_tokens"), attrs.get("max_tokens")
        if new is not None and old is not None and new != old:
            raise serializers.ValidationError(
                "max_tokens is the former name of max_output_tokens: give one of them.")
        return attrs


class JobOut(serializers.ModelSerializer[Job]):
    est_cost_cents = serializers.IntegerField(allow_null=True)
    reasoning_budget = serializers.SerializerMethodField()
    reasoning_effort = serializers.SerializerMethodField()
    failure_code = serializers.SerializerMethodField()
    failure_reason = serializers.SerializerMethodField()
    created_at = serializers.SerializerMethodField()
    approved_at = serializers.SerializerMethodField()
    data_expires_at = serializers.SerializerMethodField()
    data_deleted_at = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = ["id", "status", "est_input_tok", "est_output_tok", "est_cost_cents",
                  "est_processing_seconds", "max_output_tokens", "reasoning_budget",
                  "success_rows", "error_rows", "format_error_rows", "truncated_rows",
                  "pending_rows", "created_at", "approved_at", "data_expires_at", "partial",
                  "failure_code", "failure_reason", "model", "reasoning", "reasoning_effort",
                  "task_type", "format", "response_format", "dimensions", "video_fps",
                  "data_residency", "data_deleted_at"]

    def to_representation(self, job: Job) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(job)
        if job.max_tokens_alias:
            data["max_tokens"] = job.max_output_tokens_requested  # echoed under its old name
        # Re-runs, only where there are some, so an ordinary job's answer is exactly the
        # reference's: on a re-run the job whose rows it runs again, on a job re-run its
        # re-runs, oldest first.
        if job.parent_id:
            data["parent_id"] = str(job.parent_id)
        children = [str(pk) for pk in job.children.order_by("created_at", "id")
                    .values_list("pk", flat=True)]
        if children:
            data["children"] = children
        return data

    def get_reasoning_budget(self, job: Job) -> int | None:
        model = model_get(job.model)
        return job.reasoning_budget if model is not None and model.reasoning else None

    def get_reasoning_effort(self, job: Job) -> str | None:
        return job.reasoning_effort or None

    def get_failure_code(self, job: Job) -> str | None:
        return job.failure_code or None

    def get_failure_reason(self, job: Job) -> str | None:
        return job.failure_reason or None

    def get_created_at(self, job: Job) -> str | None:
        return utc_offset_iso(job.created_at)

    def get_approved_at(self, job: Job) -> str | None:
        return utc_offset_iso(job.approved_at)

    def get_data_expires_at(self, job: Job) -> str | None:
        return utc_offset_iso(job.data_expires_at)

    def get_data_deleted_at(self, job: Job) -> str | None:
        return utc_offset_iso(job.data_deleted_at)


def _holds_nul(value: Any) -> bool:
    """Whether a NUL character is in any string or key of a JSON value, at any depth."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            if "\x00" in node:
                return True
        elif isinstance(node, dict):
            stack.extend(node)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


JOB_STATE_SCHEMA = {
    "type": "object",
    "required": ["id", "status"],
    "properties": {"id": {"type": "string", "format": "uuid"},
                   "status": {"type": "string", "enum": list(JobStatus.values)}},
}


class CheckOut(serializers.ModelSerializer[PreflightCheck]):
    """GET /checks/{id}: the outcome once every row was read (errors empty until then)."""

    input_id = serializers.UUIDField()
    created_at = serializers.SerializerMethodField()
    finished_at = serializers.SerializerMethodField()

    class Meta:
        model = PreflightCheck
        fields = ["id", "status", "input_id", "model", "row_count", "est_input_tok",
                  "error_count", "created_at", "finished_at"]

    def to_representation(self, check: PreflightCheck) -> dict[str, Any]:
        data: dict[str, Any] = super().to_representation(check)
        # Not a declared field: a serializer's own `errors` is its validation errors.
        failing = list(check.errors) if check.status != CheckStatus.CHECKING else []
        ordered = list(data.items())
        at = [name for name, _ in ordered].index("error_count") + 1
        return dict([*ordered[:at], ("errors", failing), *ordered[at:]])

    def get_created_at(self, check: PreflightCheck) -> str | None:
        return utc_offset_iso(check.created_at)

    def get_finished_at(self, check: PreflightCheck) -> str | None:
        return utc_offset_iso(check.finished_at)


CHECK_STATE_SCHEMA = {
    "type": "object",
    "required": ["id", "status"],
    "properties": {"id": {"type": "string", "format": "uuid"},
                   "status": {"type": "string", "enum": list(CheckStatus.values)}},
}
CHECK_ERROR_SCHEMA = {
    "type": "object",
    "required": ["line", "custom_id", "reason"],
    "properties": {
        "line": {"type": ["integer", "null"],
                 "description": "The JSONL line number (from 1); null for a parquet row or a "
                                "fault of the whole file."},
        "custom_id": {"type": ["string", "null"],
                      "description": "The row's custom_id (parquet: its id), when readable."},
        "reason": {"type": "string",
                   "description": "The failure_reason a job on this input would fail with."},
        "row_index": {"type": "integer", "description": "Parquet rows only."},
    },
}


class RerunIn(serializers.Serializer):
    include = serializers.ListField(
        child=serializers.ChoiceField(choices=[o.value for o in RERUN_OUTCOMES]),
        required=False, allow_empty=False,
        help_text="The row outcomes to run again; default [\"error\"].")

    def validate_include(self, value: list[str]) -> list[str]:
        # Kept in RowOutcome's order, each once, so the same choice is the same request.
        return [o.value for o in RowOutcome if o.value in set(value)]


RERUN_SCHEMA = {
    "type": "object",
    "required": ["id", "status", "parent_id"],
    "properties": {"id": {"type": "string", "format": "uuid"},
                   "status": {"type": "string", "enum": list(JobStatus.values)},
                   "parent_id": {"type": "string", "format": "uuid"},
                   "row_count": {"type": "integer",
                                 "description": "The rows the re-run runs again."}},
}

CHECK_OUT_SCHEMA = {
    "type": "object",
    "required": ["id", "status", "input_id", "model", "row_count", "est_input_tok",
                 "error_count", "errors", "created_at", "finished_at"],
    "properties": {
        "id": {"type": "string", "format": "uuid"},
        "status": {"type": "string", "enum": list(CheckStatus.values)},
        "input_id": {"type": "string", "format": "uuid"},
        "model": {"type": "string"},
        "row_count": {"type": ["integer", "null"],
                      "description": "Rows in the file, failing ones included; null while "
                                     "checking or when the file could not be read."},
        "est_input_tok": {"type": ["integer", "null"],
                          "description": "Input tokens of the rows that passed, media "
                                         "included: what a job's estimate would count."},
        "error_count": {"type": ["integer", "null"],
                        "description": "Every failing row and file fault, also past the "
                                       "1,000 listed."},
        "errors": {"type": "array", "items": CHECK_ERROR_SCHEMA, "maxItems": 1000},
        "created_at": {"type": "string", "format": "date-time"},
        "finished_at": {"type": ["string", "null"], "format": "date-time"},
    },
}
