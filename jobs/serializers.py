"""The batch API's wire shapes: input serializers check shape only (a missing or wrongly
typed field is 422); the reference's 400 rules are the services' and views' to raise, and
their schema says them too (jobs/openapi.py). Every answer goes out through an output
serializer, which is also what /openapi.json says it is."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.core.validators import ProhibitNullCharactersValidator
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from anex.api.serializers import (
    NOT_BLANK,
    Closed,
    Documented,
    DocumentedCharField,
    DocumentedJSONField,
    DocumentedListField,
    Omissible,
)
from anex.internals.prototyped import Prototyped
from anex.regions import Region
from inference.catalog import catalog_tiers, model_get
from inference.constants import MAX_OUTPUT_TOKENS, RowOutcome
from inference.rows.core import JobOptions
from jobs.constants import (
    CHECK_ERRORS_MAX,
    RERUN_OUTCOMES,
    CheckStatus,
    InputStatus,
    JobStatus,
    Priority,
)
from jobs.models import Input, Job, PreflightCheck
from jobs.openapi import (
    CALLBACK_URL_PATTERN,
    INPUT_FORMAT_SCHEMA,
    RESPONSE_FORMAT_SCHEMA,
    SOURCE_URL_PATTERN,
    input_create_constraints,
    job_create_constraints,
)

_TEXT = {"type": "string", "pattern": NOT_BLANK}


def utc_iso(moment: datetime | None) -> str | None:
    """The reference's timestamp shape: 2026-07-26T15:04:05Z."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if moment else None


def utc_offset_iso(moment: datetime | None) -> str | None:
    """The reference's job timestamps: 2026-07-24T10:30:00+00:00."""
    return moment.astimezone(UTC).isoformat(timespec="seconds") if moment else None


class UtcTimestampField(serializers.DateTimeField):
    """An input's timestamps, as utc_iso writes them."""

    def to_representation(self, value: datetime) -> str:
        stamp = utc_iso(value)  # never None: DRF answers null itself for a None
        assert stamp is not None
        return stamp


class UtcOffsetTimestampField(serializers.DateTimeField):
    """A job's and a check's timestamps, as utc_offset_iso writes them."""

    def to_representation(self, value: datetime) -> str:
        stamp = utc_offset_iso(value)  # never None: DRF answers null itself for a None
        assert stamp is not None
        return stamp


# -- inputs --------------------------------------------------------------------------------

class InputCreateIn(Closed, serializers.Serializer):  # type: ignore[type-arg]
    """POST /inputs: a direct upload (a format; nothing to fetch or call back) or an
    ingest (a source_url to copy from)."""

    source_url = DocumentedCharField(
        required=False, max_length=8192,
        openapi={"type": "string", "format": "uri", "pattern": SOURCE_URL_PATTERN,
                 "description": "An https:// URL to copy the input from (an ingest). Its "
                                "host must resolve to a public internet address."})
    format = DocumentedCharField(
        required=False, max_length=32,
        openapi={**INPUT_FORMAT_SCHEMA, "description": "Required for a direct upload; for an "
                 "ingest, read from the URL's extension when left out."})
    callback_url = DocumentedCharField(
        required=False, max_length=2000,
        openapi={"type": "string", "format": "uri", "pattern": CALLBACK_URL_PATTERN,
                 "description": "An https:// URL told when the ingest is ready or failed; "
                                "only with source_url."})
    data_residency = serializers.ChoiceField(choices=Region.values, required=False)

    @classmethod
    def openapi_constraints(cls) -> dict[str, Any]:
        return input_create_constraints()


class InputUploadOut(serializers.Serializer):  # type: ignore[type-arg]
    """POST /inputs without a source_url: a presigned target to upload the file to."""

    id = serializers.UUIDField(source="input.pk")
    status = serializers.ChoiceField(choices=[InputStatus.AWAITING_UPLOAD],
                                     source="input.status")
    upload_url = serializers.URLField(source="target.upload_url")
    expires_at = UtcTimestampField(source="input.upload_expires_at")
    input_s3_uri = serializers.CharField(source="input.input_s3_uri")

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        # "fields" cannot be declared: the name would shadow Serializer.fields.
        fields = dict(super().get_fields())
        form = serializers.DictField(
            child=serializers.CharField(), source="target.fields",
            help_text="Send every entry as a form field, then the file, last.")
        ordered = list(fields.items())
        return dict([*ordered[:3], ("fields", form), *ordered[3:]])


class InputIngestOut(serializers.Serializer):  # type: ignore[type-arg]
    """POST /inputs with a source_url: the copy, started."""

    id = serializers.UUIDField(source="input.pk")
    status = serializers.ChoiceField(choices=[InputStatus.PENDING], source="input.status")
    input_s3_uri = serializers.CharField(source="input.input_s3_uri")
    callback_secret = serializers.CharField(
        required=False, help_text="Only with a callback_url; shown this once.")


class InputOut(serializers.ModelSerializer[Input]):
    error = serializers.SerializerMethodField()
    expires_at = serializers.SerializerMethodField()

    class Meta:
        model = Input
        fields = ["id", "status", "format", "data_residency", "input_s3_uri", "error",
                  "expires_at", "size_bytes", "created_at"]
        read_only_fields = fields

    def get_error(self, item: Input) -> str | None:
        return item.error or None

    @extend_schema_field({"type": ["string", "null"], "format": "date-time"})
    def get_expires_at(self, item: Input) -> str | None:
        """The upload window while awaiting the upload; the retention deadline while ready."""
        if item.status == InputStatus.AWAITING_UPLOAD:
            return utc_iso(item.upload_expires_at)
        if item.status == InputStatus.READY:
            return utc_iso(item.expires_at)
        return None


# -- jobs ----------------------------------------------------------------------------------

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


class PositiveNumberField(Documented, StrictNumberField):
    pass


PRIORITY_INVALID = ('priority must be one of flex, standard, priority '
                    '(docs/estimates.md, "Urgency tiers"); got "{input}".')


class JobCreateIn(Closed, serializers.Serializer):  # type: ignore[type-arg]
    """POST /jobs and POST /checks. An integer is a JSON integer written without a fraction
    (1, not 1.0), reasoning is true, false or null, and video_fps a JSON number: nothing is
    read from a string."""

    input_id = DocumentedCharField(required=False, allow_null=True, max_length=100,
                                   openapi=_TEXT)
    input_s3_uri = DocumentedCharField(required=False, allow_null=True, max_length=600,
                                       openapi=_TEXT)
    model = serializers.CharField(max_length=100)
    max_output_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1,
                                           max_value=MAX_OUTPUT_TOKENS)
    max_tokens = StrictIntegerField(required=False, allow_null=True, min_value=1,
                                    max_value=MAX_OUTPUT_TOKENS,
                                    help_text="The former name of max_output_tokens: give "
                                              "one of them.")
    reasoning = StrictBooleanField(required=False, allow_null=True)
    reasoning_budget = StrictIntegerField(required=False, allow_null=True, min_value=0,
                                          max_value=MAX_OUTPUT_TOKENS)
    reasoning_effort = serializers.CharField(required=False, allow_null=True, max_length=32)
    video_fps = PositiveNumberField(required=False, allow_null=True,
                                    openapi={"type": "number", "exclusiveMinimum": 0})
    response_format = DocumentedJSONField(required=False, allow_null=True,
                                          openapi=RESPONSE_FORMAT_SCHEMA)
    dimensions = StrictIntegerField(required=False, allow_null=True, min_value=1)
    data_residency = serializers.ChoiceField(choices=Region.values, required=False,
                                             allow_null=True)
    priority = serializers.ChoiceField(
        choices=Priority.values, required=False, allow_null=True,
        error_messages={"invalid_choice": PRIORITY_INVALID},
        help_text="The urgency tier: flex (half price, a 72-hour window, runs on capacity "
                  "nothing else wants), standard (the default) or priority (1.75x the price, "
                  "dispatched ahead of standard work). docs/estimates.md, \"Urgency tiers\".")

    @classmethod
    def openapi_constraints(cls) -> dict[str, Any]:
        return job_create_constraints()

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

    def options(self) -> JobOptions:
        """The job's options from the checked body (is_valid first)."""
        data = self.validated_data
        new, old = data.get("max_output_tokens"), data.get("max_tokens")
        return JobOptions(
            model=data["model"], max_output_tokens=new if new is not None else old,
            max_tokens_alias=new is None and old is not None, reasoning=data.get("reasoning"),
            reasoning_budget=data.get("reasoning_budget"),
            reasoning_effort=data.get("reasoning_effort"), video_fps=data.get("video_fps"),
            response_format=data.get("response_format"), dimensions=data.get("dimensions"))


def _holds_nul(value: Any) -> bool:
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


class JobStateOut(serializers.Serializer):  # type: ignore[type-arg]
    """The reference's answer to submit, approve and cancel: the id and the new status."""

    id = serializers.UUIDField(source="pk")
    status = serializers.ChoiceField(choices=JobStatus.choices)


class JobOut(Prototyped, serializers.ModelSerializer[Job]):
    est_cost_cents = serializers.IntegerField(allow_null=True)
    priority = serializers.ChoiceField(
        choices=Priority.values,
        help_text="The urgency tier the job was submitted in: flex, standard or priority.")
    completion_window_hours = serializers.SerializerMethodField(
        help_text="The tier's completion window, from approval: 72 for flex, 24 for standard "
                  "and priority (docs/estimates.md, \"Urgency tiers\").")
    promoted_at = UtcOffsetTimestampField(
        allow_null=True, help_text="A flex job unfinished 48 hours after its approval is "
                                   "dispatched as standard from then on (its price unchanged): "
                                   "when; null otherwise.")
    reasoning_budget = serializers.SerializerMethodField()
    reasoning_effort = serializers.SerializerMethodField()
    failure_code = serializers.SerializerMethodField()
    failure_reason = serializers.SerializerMethodField()
    created_at = UtcOffsetTimestampField()
    approved_at = UtcOffsetTimestampField(allow_null=True)
    data_expires_at = UtcOffsetTimestampField(allow_null=True)
    data_deleted_at = UtcOffsetTimestampField(allow_null=True)
    response_format = DocumentedJSONField(allow_null=True, openapi=RESPONSE_FORMAT_SCHEMA)
    # Only where they apply, so an ordinary job's answer is exactly the reference's.
    max_tokens = Omissible(openapi={"type": "integer"},
                           help_text="Only when the job was submitted with max_tokens: the "
                                     "value, echoed under its former name.")
    parent_id = Omissible(openapi={"type": "string", "format": "uuid"},
                          help_text="Only on a re-run: the job whose rows it runs again.")
    children = Omissible(openapi={"type": "array", "items": {"type": "string",
                                                             "format": "uuid"}},
                         help_text="Only on a job that was re-run: its re-runs, oldest first.")
    # What the rows share (docs/estimates.md): stated by the estimate, null where it was
    # not computed (a parquet input; est_shared_prefix_share on chat jobs alone).
    est_shared_prefix_share = serializers.FloatField(
        allow_null=True, min_value=0, max_value=1,
        help_text="The share of the rows' prompt bytes that the row planned before each "
                  "already held (chat jobs, JSONL inputs); null where not computed.")
    est_identical_rows = serializers.IntegerField(
        allow_null=True, min_value=0,
        help_text="Rows that repeat an earlier row but for custom_id (JSONL inputs); "
                  "null where not computed.")
    cached_input_tok = serializers.SerializerMethodField(
        help_text="Input tokens the engine served from its prefix cache, summed over the "
                  "job's rows once it has ended; 0 before then and where none were.")

    class Meta:
        model = Job
        fields = ["id", "status", "est_input_tok", "est_output_tok", "est_cost_cents",
                  "est_processing_seconds", "max_output_tokens", "reasoning_budget",
                  "success_rows", "error_rows", "format_error_rows", "truncated_rows",
                  "pending_rows", "created_at", "approved_at", "data_expires_at", "partial",
                  "failure_code", "failure_reason", "model", "reasoning", "reasoning_effort",
                  "task_type", "format", "response_format", "dimensions", "video_fps",
                  "data_residency", "data_deleted_at", "max_tokens", "parent_id", "children",
                  # anex's own, after the reference's (issue 43, docs/estimates.md)
                  "est_shared_prefix_share", "est_identical_rows", "cached_input_tok",
                  # issue 44: the urgency tier
                  "priority", "completion_window_hours", "promoted_at"]
        read_only_fields = fields

    def get_completion_window_hours(self, job: Job) -> int:
        return catalog_tiers()[job.priority].completion_hours

    def get_reasoning_budget(self, job: Job) -> int | None:
        model = model_get(job.model)
        return job.reasoning_budget if model is not None and model.reasoning else None

    def get_reasoning_effort(self, job: Job) -> str | None:
        return job.reasoning_effort or None

    def get_cached_input_tok(self, job: Job) -> int:
        # Read off the usage the job recorded when it ended, whichever fields it holds (a
        # usage recorded before cached tokens were counted has none: 0).
        usage = job.usage if isinstance(job.usage, dict) else {}
        value = usage.get("cached_input_tokens")
        return value if isinstance(value, int) and value > 0 else 0

    def get_failure_code(self, job: Job) -> str | None:
        return job.failure_code or None

    def get_failure_reason(self, job: Job) -> str | None:
        return job.failure_reason or None

    def get_max_tokens(self, job: Job) -> int | None:
        return job.max_output_tokens_requested if job.max_tokens_alias else None

    def get_parent_id(self, job: Job) -> str | None:
        return str(job.parent_id) if job.parent_id else None

    def get_children(self, job: Job) -> list[str] | None:
        ids = getattr(job, "children_ids", None)  # read with the job (jobs.selectors.job_read)
        if ids is None:
            ids = job.children.order_by("created_at", "id").values_list("pk", flat=True)
        return [str(pk) for pk in ids] or None


class ProgressOut(Prototyped, serializers.Serializer):  # type: ignore[type-arg]
    """GET /jobs/{id}/progress (jobs.selectors.Progress)."""

    done_rows = serializers.IntegerField(help_text="Rows whose answer (or row error) is in; "
                                                   "they arrive a chunk at a time.")
    total_rows = serializers.IntegerField(allow_null=True, help_text="The input's rows; null "
                                                                     "until it is counted.")
    eta_seconds = serializers.IntegerField(
        allow_null=True, help_text="Seconds until the remaining rows are done at the rate so "
                                   "far; 0 when none remain; null when unknown.")
    rows_per_second = serializers.FloatField(
        allow_null=True, help_text="Rows done per second since approval; null before the "
                                   "first rows are done.")
    rows_readable_after = serializers.IntegerField(
        help_text="How far GET /jobs/{id}/rows reads now: the result lines up to this line "
                  "number are finished and in order (0 before any is).")


class JobResultOut(serializers.Serializer):  # type: ignore[type-arg]
    """GET /jobs/{id}/result: a fresh presigned link to the result file."""

    id = serializers.UUIDField()
    status = serializers.ChoiceField(choices=JobStatus.choices)
    result_url = serializers.URLField()
    expires_in = serializers.IntegerField(help_text="Seconds the link stays valid.")
    partial = serializers.BooleanField()  # type: ignore[assignment]  # a field, not the attr
    row_count = serializers.IntegerField(help_text="The rows in the file.")
    merged = serializers.BooleanField(required=False, help_text="Only with ?merged=true: the "
                                                                "file merges the job's re-runs.")


class JobDataDeletedOut(serializers.Serializer):  # type: ignore[type-arg]
    """DELETE /jobs/{id}/data: 200 once the data is gone, 202 while the job stops first."""

    id = serializers.UUIDField(source="job.pk")
    status = serializers.ChoiceField(choices=JobStatus.choices, source="job.status")
    data_deleted_at = UtcOffsetTimestampField(source="job.data_deleted_at", allow_null=True)
    message = serializers.CharField(required=False, help_text="Only while the job stops: its "
                                                              "data goes once it has.")


class RerunIn(Closed, serializers.Serializer):  # type: ignore[type-arg]
    include = DocumentedListField(
        child=serializers.ChoiceField(choices=[o.value for o in RERUN_OUTCOMES]),
        required=False, allow_empty=False,
        openapi={"type": "array", "minItems": 1,
                 "items": {"type": "string", "enum": [o.value for o in RERUN_OUTCOMES]}},
        help_text="The row outcomes to run again; default [\"error\"].")

    def validate_include(self, value: list[str]) -> list[str]:
        # Kept in RowOutcome's order, each once, so the same choice is the same request.
        return [o.value for o in RowOutcome if o.value in set(value)]


class RerunOut(serializers.Serializer):  # type: ignore[type-arg]
    """POST /jobs/{id}/rerun: the new (child) job."""

    id = serializers.UUIDField(source="child.pk")
    status = serializers.ChoiceField(choices=JobStatus.choices, source="child.status")
    parent_id = serializers.UUIDField(source="child.parent_id")
    row_count = serializers.IntegerField(help_text="The rows the re-run runs again.")


# -- preflight checks ------------------------------------------------------------------------

class CheckStateOut(serializers.Serializer):  # type: ignore[type-arg]
    """POST /checks: the check, started."""

    id = serializers.UUIDField(source="pk")
    status = serializers.ChoiceField(choices=CheckStatus.choices)


class CheckErrorOut(serializers.Serializer):  # type: ignore[type-arg]
    line = serializers.IntegerField(allow_null=True, help_text="The JSONL line number (from "
                                    "1); null for a parquet row or a fault of the whole file.")
    custom_id = serializers.CharField(allow_null=True, help_text="The row's custom_id "
                                      "(parquet: its id), when readable.")
    reason = serializers.CharField(help_text="The failure_reason a job on this input would "
                                             "fail with.")
    row_index = serializers.IntegerField(required=False, help_text="Parquet rows only.")


class CheckErrorsField(serializers.ListField):
    """A check's failing rows: none listed while it is still checking."""

    def get_attribute(self, check: PreflightCheck) -> list[dict[str, Any]]:
        return list(check.errors) if check.status != CheckStatus.CHECKING else []


class CheckOut(serializers.ModelSerializer[PreflightCheck]):
    """GET /checks/{id}: the outcome once every row was read (errors empty until then)."""

    input_id = serializers.UUIDField()
    created_at = UtcOffsetTimestampField()
    finished_at = UtcOffsetTimestampField(allow_null=True)

    class Meta:
        model = PreflightCheck
        fields = ["id", "status", "input_id", "model", "row_count", "est_input_tok",
                  "error_count", "created_at", "finished_at"]
        read_only_fields = fields

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        # "errors" cannot be declared: the name would shadow Serializer.errors.
        fields = dict(super().get_fields())
        failing = CheckErrorsField(child=CheckErrorOut(), max_length=CHECK_ERRORS_MAX,
                                   read_only=True,
                                   help_text="Every failing row and file fault, up to "
                                             f"{CHECK_ERRORS_MAX:,}; error_count counts all.")
        ordered = list(fields.items())
        at = [name for name, _ in ordered].index("error_count") + 1
        return dict([*ordered[:at], ("errors", failing), *ordered[at:]])
