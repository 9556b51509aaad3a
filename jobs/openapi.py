"""What the batch API's request bodies are held to beyond their serializers' types, as
OpenAPI (anex/api/serializers.py, `Documented` and `Constrained`): the rules the views
raise 400 for and the task kinds' per-model field rules (422), read from the catalog so
/openapi.json states them for every model it accepts.

One rule is not here because JSON Schema cannot compare two values: a reasoning_budget of
1 or more must be at least BUDGET_HEADROOM below an explicit max_output_tokens. The
schema says so in words, and the API answers 422 (inference/kinds/chat.py).
"""

from __future__ import annotations

from typing import Any

from anex.api.schema import JSON_VALUE_REF
from anex.api.serializers import NO_NUL
from inference.catalog import CatalogModel, catalog_all
from inference.constants import InputFormat
from inference.kinds import kind_for
from inference.kinds.base import GENERATION_FIELDS
from inference.kinds.chat import BUDGET_HEADROOM, ChatKind
from inference.kinds.embed import EmbedKind

_PORT = r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
# source_url: what the view (https, a host) and the fetcher (anex/net.py: no whitespace,
# control character or backslash, no credentials, a host name of DNS labels, a port from 1)
# accept before they look the host up. Whether the name resolves to a public address is
# only known then (400, "source_url cannot be fetched: ... is not a public internet address").
SOURCE_URL_PATTERN = (r"^[Hh][Tt][Tt][Pp][Ss]://[A-Za-z0-9_-]{1,63}(?:\.[A-Za-z0-9_-]{1,63})*\.?"
                      rf"(?::{_PORT})?(?:[/?#][^\x00-\x20\x7f\\]*)?$")
# callback_url: the view's rule only (https with a host); it is fetched when the copy ends.
CALLBACK_URL_PATTERN = (r"^[Hh][Tt][Tt][Pp][Ss]://(?:[^/?#\[\]\u0000]*@)?[^/?#@:\[\]\u0000]+"
                        r"(?::[^/?#@\[\]\u0000]*)?(?:[/?#][^\u0000]*)?$")
INPUT_FORMAT_SCHEMA: dict[str, Any] = {"type": "string", "enum": list(InputFormat.values)}

# The rest of a response_format is kept as given: any JSON that PostgreSQL can store.
_KEPT: dict[str, Any] = {"propertyNames": {"pattern": NO_NUL},
                         "additionalProperties": {"$ref": JSON_VALUE_REF}}
RESPONSE_FORMAT_SCHEMA: dict[str, Any] = {
    "oneOf": [
        {"type": "object", "required": ["type"],
         "properties": {"type": {"const": "json_object"}}, **_KEPT},
        {"type": "object", "required": ["type", "json_schema"],
         "properties": {"type": {"const": "json_schema"},
                        "json_schema": {"type": "object", "required": ["schema"],
                                        "properties": {"schema": {"type": "object", **_KEPT}},
                                        **_KEPT}},
         **_KEPT},
    ],
    "description": "Applied to every row (output-format.txt). At most 64 KiB as JSON and 64 "
                   "levels deep; a $ref inside the schema must start with '#', and a "
                   "pattern must be one RE2 compiles (400 otherwise). No string or key may "
                   "hold a NUL character (422, as in every other field).",
}

_NULL: dict[str, Any] = {"type": "null"}
_ABSENT: dict[str, Any] = {"not": {}}  # the property is not given at all


def _among(*values: Any) -> dict[str, Any]:
    # Not `enum`: drf-spectacular would name every such set as a component.
    return {"anyOf": [{"const": value} for value in values]}
# The former name of max_output_tokens is refused with it on the same models.
_OUTPUT_CAP_FIELDS = ("max_output_tokens", "max_tokens")


def input_create_constraints() -> dict[str, Any]:
    """POST /inputs: an upload (a format, nothing to fetch or call back) or an ingest."""
    return {"oneOf": [
        {"title": "upload", "description": "A presigned target to upload the file to.",
         "required": ["format"], "properties": {"source_url": _ABSENT, "callback_url": _ABSENT}},
        {"title": "ingest", "description": "A copy of the file at source_url.",
         "required": ["source_url"]},
    ]}


def job_create_constraints() -> dict[str, Any]:
    """POST /jobs and POST /checks: one input, one name for the output cap, and the job
    fields the model takes (inference/kinds: fields_problem)."""
    return {"allOf": [
        {"oneOf": [
            {"title": "by input_id", "required": ["input_id"],
             "properties": {"input_id": {"type": "string"}, "input_s3_uri": _NULL}},
            {"title": "by input_s3_uri", "required": ["input_s3_uri"],
             "properties": {"input_s3_uri": {"type": "string"}, "input_id": _NULL}},
        ]},
        {"anyOf": [{"properties": {"max_tokens": _NULL}},
                   {"properties": {"max_output_tokens": _NULL}}]},
        {"oneOf": [model_fields(model) for model in catalog_all().values()]},
    ]}


def model_fields(model: CatalogModel) -> dict[str, Any]:
    """The job-level fields one model takes, as a schema its submit body must also meet."""
    kind = kind_for(model)
    properties: dict[str, Any] = {"model": {"const": model.id}}
    variant: dict[str, Any] = {"title": model.id, "properties": properties}
    if isinstance(kind, ChatKind):
        properties["dimensions"] = _NULL
        if not model.reasoning:
            properties["reasoning"] = _among(False, None)
            properties["reasoning_budget"] = _among(0, None)
        properties["reasoning_effort"] = (_among(*model.effort_levels, None)
                                          if model.effort_levels else _NULL)
        ceiling = model.media.video_fps_max
        properties["video_fps"] = {"maximum": ceiling} if ceiling is not None else _NULL
        if model.reasoning or model.effort_levels:
            # A budget of 1 or more, or an effort level, needs thinking on.
            variant["anyOf"] = [
                {"properties": {"reasoning": _among(True, None)}},
                {"properties": {"reasoning": {"const": False},
                                "reasoning_budget": _among(0, None),
                                "reasoning_effort": _NULL}}]
        if model.reasoning:
            variant["description"] = (
                f"A reasoning_budget of 1 or more must be at least {BUDGET_HEADROOM} below "
                "an explicit max_output_tokens (422 otherwise).")
        return variant
    for name in (*GENERATION_FIELDS, *_OUTPUT_CAP_FIELDS):
        properties[name] = _NULL
    low, high = model.dimensions_min, model.dimensions_native
    if isinstance(kind, EmbedKind) and low is not None and high is not None:
        properties["dimensions"] = {"minimum": low, "maximum": high}
    else:
        properties["dimensions"] = _NULL
    return variant
