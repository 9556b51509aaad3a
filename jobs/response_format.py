"""The structural check of a response_format, job-level (400 at submit) or per row.

output-format.txt: two shapes are accepted, {"type": "json_object"} and {"type":
"json_schema", "json_schema": {"schema": {...}}}. The check is structural: the schema's
own contents are not validated against the JSON Schema spec, so a well-formed but
unsatisfiable schema still reaches the model (and its rows may end as format errors).
"""

from __future__ import annotations

from typing import Any

TYPES = ("json_schema", "json_object")


def response_format_problem(value: Any) -> str | None:
    """What is wrong with this response_format's shape, or None when it is well formed."""
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        return "response_format must be an object with a type."
    kind = value["type"]
    if kind not in TYPES:
        return f"response_format.type must be json_schema or json_object, not {kind!r}."
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            return ("response_format of type json_schema needs an object at "
                    "response_format.json_schema.schema.")
    return None
