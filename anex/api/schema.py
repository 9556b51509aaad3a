"""OpenAPI for drf-spectacular: the API key schemes, the schema a field or a body adds to
what its serializer says (anex/api/serializers.py), and the document's finishing touches
(SPECTACULAR_SETTINGS' POSTPROCESSING_HOOKS): links from a create to the operations that
take its id, the JsonValue component, a body that cannot be empty marked required,
single-use answer shapes inline, and each `required` in field order."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)

from anex.api.serializers import NO_NUL, Closed

LINKS_EXTENSION = "x-anex-links"
_SCHEMAS = "#/components/schemas/"
# Any JSON value with no NUL character (U+0000) in a string or a key, at any depth: what
# PostgreSQL's jsonb can store (a JSON body field kept as given, such as a response_format).
JSON_VALUE_REF = f"{_SCHEMAS}JsonValue"
JSON_VALUE_SCHEMA: dict[str, Any] = {
    "description": "Any JSON value without a NUL character (U+0000) in a string or a key.",
    "anyOf": [
        {"type": "string", "pattern": NO_NUL},
        {"type": ["number", "boolean", "null"]},
        {"type": "array", "items": {"$ref": JSON_VALUE_REF}},
        {"type": "object", "propertyNames": {"pattern": NO_NUL},
         "additionalProperties": {"$ref": JSON_VALUE_REF}},
    ],
}


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "anex.api.authentication.ApiKeyAuthentication"
    name = ["bearerAuth", "apiKeyHeader"]

    def get_security_requirement(self, auto_schema: Any) -> list[dict[str, list[Any]]]:
        # Either header carries the key: two alternatives, never both at once.
        return [{"bearerAuth": []}, {"apiKeyHeader": []}]

    def get_security_definition(self, auto_schema: Any) -> list[dict[str, Any]]:
        return [
            {
                "type": "http",
                "scheme": "bearer",
                "description": "An API key from the console's Keys page: sk-…",
            },
            {
                "type": "apiKey",
                "in": "header",
                "name": "x-api-key",
                "description": "The same API key, for clients that send x-api-key.",
            },
        ]


class DocumentedFieldExtension(OpenApiSerializerFieldExtension):
    """A Documented field (Omissible and Verbatim among them): its own `openapi` schema;
    drf-spectacular adds null, minLength and maxLength from the field as for any other."""

    target_class = "anex.api.serializers.Documented"
    match_subclasses = True

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = dict(self.target.openapi)
        if getattr(self.target, "allow_null", False) and "enum" in schema:
            schema["enum"] = [*schema["enum"], None]
        return schema


class ConstrainedSerializerExtension(OpenApiSerializerExtension):
    """A Constrained body: its fields' schema plus the rules between them; a Closed one
    takes no property beyond its fields."""

    target_class = "anex.api.serializers.Constrained"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema: dict[str, Any] = auto_schema._map_serializer(self.target, direction,
                                                             bypass_extensions=True)
        constraints = self.target.openapi_constraints()
        target = self.target  # the serializer, or its class
        if issubclass(target if isinstance(target, type) else type(target), Closed):
            constraints = {**constraints, "additionalProperties": False}
        assert not set(constraints) & set(schema), "constraints beside the fields, not over"
        return {**schema, **constraints}


def links(status: int, parameter: str, operation_ids: tuple[str, ...]) -> dict[str, Any]:
    """extend_schema(extensions=…) for an operation whose `status` answer carries an id in
    `id`: an OpenAPI link to each operation that takes that id as `parameter`."""
    return {LINKS_EXTENSION: {str(status): {
        operation_id: {"operationId": operation_id,
                       "parameters": {parameter: "$response.body#/id"}}
        for operation_id in operation_ids}}}


def links_place(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Move each operation's declared links into the answer they start from."""
    for operation in _operations(result):
        for status, found in operation.pop(LINKS_EXTENSION, {}).items():
            operation["responses"][status].setdefault("links", {}).update(found)
    return result


def json_value_add(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """The JsonValue component, where a schema refers to it."""
    uses: dict[str, int] = {}
    _count_refs(result, uses)
    if uses.get(JSON_VALUE_REF.removeprefix(_SCHEMAS)):
        result.setdefault("components", {}).setdefault("schemas", {})["JsonValue"] = \
            JSON_VALUE_SCHEMA
    return result


def bodies_required(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """A request body that must name some property in every alternative it has cannot be
    left out (an absent JSON body reads as {}): say that it is required."""
    schemas: dict[str, Any] = result.get("components", {}).get("schemas", {})
    for operation in _operations(result):
        body = operation.get("requestBody")
        if not body or body.get("required"):
            continue
        if all(_needs_a_property(media.get("schema", {}), schemas)
               for media in body.get("content", {}).values()):
            body["required"] = True
    return result


def _needs_a_property(schema: dict[str, Any], schemas: dict[str, Any]) -> bool:
    ref = schema.get("$ref", "")
    if ref.startswith(_SCHEMAS):
        return _needs_a_property(schemas.get(ref.removeprefix(_SCHEMAS), {}), schemas)
    if schema.get("required"):
        return True
    alternatives = [schema[key] for key in ("oneOf", "anyOf") if key in schema]
    if any(all(_needs_a_property(branch, schemas) for branch in branches)
           for branches in alternatives):
        return True
    return any(_needs_a_property(part, schemas) for part in schema.get("allOf", []))


def answers_inline(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """Put an answer's body schema in place where no other schema or operation uses it,
    so an operation reads whole; shared shapes (a job's state, the error) stay components."""
    schemas: dict[str, Any] = result.get("components", {}).get("schemas", {})
    uses: dict[str, int] = {}
    _count_refs(result, uses)
    for operation in _operations(result):
        for response in operation.get("responses", {}).values():
            for media in response.get("content", {}).values():
                ref = media.get("schema", {}).get("$ref", "")
                name = ref.removeprefix(_SCHEMAS)
                if ref.startswith(_SCHEMAS) and uses.get(name) == 1 and name in schemas:
                    media["schema"] = schemas.pop(name)
    return result


def required_in_field_order(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular sorts `required`; list it in the order the properties are given."""
    def visit(node: Any) -> None:
        if isinstance(node, dict):
            properties, required = node.get("properties"), node.get("required")
            if isinstance(properties, dict) and isinstance(required, list):
                order = {name: index for index, name in enumerate(properties)}
                node["required"] = sorted(required, key=lambda name: order.get(name, len(order)))
            for child in node.values():
                visit(child)
        elif isinstance(node, list):
            for child in node:
                visit(child)

    visit(result)
    return result


def _operations(result: dict[str, Any]) -> list[dict[str, Any]]:
    return [operation for item in result.get("paths", {}).values()
            for method, operation in item.items()
            if method in ("get", "post", "put", "patch", "delete")]


def _count_refs(node: Any, uses: dict[str, int]) -> None:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_SCHEMAS):
            name = ref.removeprefix(_SCHEMAS)
            uses[name] = uses.get(name, 0) + 1
        for child in node.values():
            _count_refs(child, uses)
    elif isinstance(node, list):
        for child in node:
            _count_refs(child, uses)
