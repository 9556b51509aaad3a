"""The wire pieces both APIs share: the error envelope every error answer carries
(anex/api/errors.py), and what lets a serializer's OpenAPI say what is checked after it.

An input serializer checks shape only (docs/dev/style.md rule 7); the reference's 400s are the
views' and the services' to raise, and the task kinds' rules the services'. So that
/openapi.json still says every rule a request is held to, a field can carry the rest of
its schema (`Documented`) and a body the rules between its fields (`Constrained`), which
anex/api/schema.py hands to drf-spectacular. Neither changes what the serializer accepts
or how it words a refusal. A body's shape includes the fields it does not take: every input
serializer of the batch and realtime APIs is `Closed`.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from rest_framework import serializers
from rest_framework.fields import SkipField

# What a CharField takes: no NUL character (DRF refuses one, 422), and with NOT_BLANK at
# least one character that is not whitespace (a blank value, once trimmed, is refused).
NO_NUL = r"^[^\u0000]*$"
NOT_BLANK = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


class Documented:
    """A field whose OpenAPI schema adds `openapi` to what its type says: the checks made
    after the serializer (the view's or a service's), in the serializer's own words."""

    def __init__(self, *args: Any, openapi: dict[str, Any], **kwargs: Any) -> None:
        self.openapi = openapi
        super().__init__(*args, **kwargs)


class DocumentedCharField(Documented, serializers.CharField):
    pass


class DocumentedJSONField(Documented, serializers.JSONField):
    pass


class DocumentedListField(Documented, serializers.ListField):
    pass


class Constrained:
    """A request body whose OpenAPI schema adds `openapi_constraints()` to its fields':
    the rules between fields, or per model, that the views and services enforce (keywords
    beside the fields' `properties`, such as oneOf, never `properties` itself)."""

    @classmethod
    def openapi_constraints(cls) -> dict[str, Any]:
        return {}


class Closed(Constrained):
    """A request body of its declared fields and no other (every body of the batch and
    realtime APIs, docs/dev/decisions/2026-12-06-unknown-body-fields.md). DRF drops a field it does
    not declare without a word, so a misspelt `max_ouput_tokens` ran the job with the default
    it meant to change: here it is refused, 422 naming it (beside any other field's
    problem), as OpenAI ("Unrecognized request argument supplied") and Stripe refuse one.
    Its schema says so: additionalProperties false (anex/api/schema.py)."""

    def to_internal_value(self, data: Any) -> Any:
        declared = self.fields  # type: ignore[attr-defined]  # a Serializer's
        unknown = [name for name in data if name not in declared] \
            if isinstance(data, Mapping) else []
        if not unknown:
            return super().to_internal_value(data)  # type: ignore[misc]  # a Serializer's
        errors: dict[str, Any] = {}
        try:
            super().to_internal_value(data)  # type: ignore[misc]
        except serializers.ValidationError as exc:
            if isinstance(exc.detail, dict):
                errors.update(exc.detail)
        errors.update({name: [unknown_field_message(name, declared)] for name in unknown})
        raise serializers.ValidationError(errors)


UNKNOWN_FIELD = "Unrecognized request argument supplied"
# A suggestion is looked for only for a name this short (difflib compares every pair of
# characters) and only where it is close: a typo, not another word.
_SUGGEST_MAX_CHARS, _SUGGEST_CUTOFF = 64, 0.8


def unknown_field_message(name: str, fields: Mapping[str, Any]) -> str:
    """What an undeclared field is answered with: the closest declared name, if any."""
    close = difflib.get_close_matches(name, list(fields), n=1, cutoff=_SUGGEST_CUTOFF) \
        if len(name) <= _SUGGEST_MAX_CHARS else []
    return f"{UNKNOWN_FIELD}; did you mean {close[0]}?" if close else f"{UNKNOWN_FIELD}."


class Omissible(Documented, serializers.Field):  # type: ignore[type-arg]
    """An answer field the reference shows only where it applies, left out (not null)
    elsewhere: the serializer's `get_<name>` gives its value, None to leave it out.
    `openapi` is its schema; it is never required."""

    def __init__(self, *, openapi: dict[str, Any], **kwargs: Any) -> None:
        kwargs.update(source="*", required=False)
        super().__init__(openapi=openapi, **kwargs)

    def get_attribute(self, instance: Any) -> Any:
        value = getattr(self.parent, f"get_{self.field_name}")(instance)
        if value is None:
            raise SkipField()
        return value

    def to_representation(self, value: Any) -> Any:
        return value


class Verbatim(Documented, serializers.Field):  # type: ignore[type-arg]
    """A value answered as it is (a vector, a model's own answer object), described by
    `openapi`: nothing is converted, so the bytes are the service's, and a long vector
    costs no per-element field."""

    def to_representation(self, value: Any) -> Any:
        return value


class Const(Documented, serializers.Field):  # type: ignore[type-arg]
    """A value every answer of its kind carries the same (OpenAI's "object": "list")."""

    def __init__(self, value: str | int, *, openapi: dict[str, Any] | None = None,
                 **kwargs: Any) -> None:
        self.value = value
        kwargs["source"] = "*"
        super().__init__(openapi=openapi or {"type": "string", "const": value}, **kwargs)

    def to_representation(self, instance: Any) -> str | int:
        return self.value


class ErrorLimitOut(serializers.Serializer):  # type: ignore[type-arg]
    code = serializers.CharField(help_text="rate_limit_exceeded, or "
                                           "concurrency_limit_exceeded on the realtime API.")
    message = serializers.CharField()


class ErrorOut(serializers.Serializer):  # type: ignore[type-arg]
    """Every error answer: {"detail": …}, and beside it what the reference shows."""

    detail = serializers.CharField(help_text="What went wrong, in words.")
    errors = serializers.DictField(required=False,  # type: ignore[assignment]  # a field
                                   help_text="422 for a malformed body: the message per field.")
    residency = serializers.CharField(required=False,
                                      help_text="421: the region the data is kept in.")
    api = serializers.CharField(required=False,
                                help_text="421: the origin to send the same request to.")
    error = ErrorLimitOut(required=False, help_text="429: why the request was limited.")


class FreshFields:
    """A request serializer on a hot path: each instance's fields are made from their
    declared arguments as DRF's own copy makes them (Field.__deepcopy__: the class called
    again with its arguments), but with the arguments shared, not deep-copied, for every
    field of every request. For fields with plain arguments that nothing mutates (numbers,
    strings, the `openapi` dicts the schema reads); no nested serializer."""

    _declared_fields: dict[str, serializers.Field]  # type: ignore[type-arg]

    def get_fields(self) -> dict[str, serializers.Field]:  # type: ignore[type-arg]
        return {name: type(field)(*field._args, **field._kwargs)  # type: ignore[attr-defined]
                for name, field in self._declared_fields.items()}
