"""The structural check of a response_format, job-level (400 at submit) or per row."""

from __future__ import annotations

from typing import Any

from jsonschema import SchemaError
from jsonschema.validators import validator_for

TYPES = ("json_schema", "json_object", "text")


def response_format_problem(value: Any) -> str | None:
    """What is wrong with this response_format, or None when it is well formed."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return "response_format must be an object with a type."
    kind = value["type"]
    if kind not in TYPES:
        return f"response_format.type must be one of {', '.join(TYPES)}, not {kind!r}."
    if kind != "json_schema":
        return None
    spec = value.get("json_schema")
    if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
        return ("response_format of type json_schema needs an object at "
                "response_format.json_schema.schema.")
    name = spec.get("name")
    if name is not None and not isinstance(name, str):
        return "response_format.json_schema.name must be a string."
    if "strict" in spec and not isinstance(spec["strict"], bool):
        return "response_format.json_schema.strict must be true or false."
    try:
        validator_for(spec["schema"]).check_schema(spec["schema"])
    except SchemaError as exc:
        return f"response_format.json_schema.schema is not a valid JSON Schema: {exc.message}"
    return None
