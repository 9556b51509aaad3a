"""The batch API's wire shapes: input serializers check shape only (a missing or wrongly
typed field is 422); the reference's 400 rules are the services' and views' to raise."""

from __future__ import annotations

from datetime import UTC, datetime

from rest_framework import serializers

from console.constants import Region
from jobs.constants import InputStatus
from jobs.models import Input


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
