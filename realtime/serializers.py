"""The realtime API's wire shapes: input serializers check shape only (a missing or wrongly
typed field is 422); the reference's rules are the task kinds' (inference/kinds), and the
body's schema states them per model (`openapi_constraints`). The answers are OpenAI's
(models, embeddings) and the reference's (decisions), each through an output serializer."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from anex.api.serializers import (
    NO_NUL,
    Closed,
    Const,
    DocumentedCharField,
    DocumentedJSONField,
    FreshFields,
    Verbatim,
)
from inference.catalog import CatalogModel, catalog_all
from inference.kinds import kind_for, kinds_all
from inference.kinds.decide import DecideKind
from inference.kinds.embed import (
    REALTIME_MAX_INPUT_CHARS,
    REALTIME_MAX_INPUTS,
    REALTIME_MAX_TOTAL_CHARS,
    EmbedKind,
)
from realtime.constants import ENCODING_FORMATS
from realtime.selectors import ListedModel

_TEXT = {"type": "string", "minLength": 1, "maxLength": REALTIME_MAX_INPUT_CHARS}


def _realtime(kind: type[EmbedKind] | type[DecideKind]) -> list[CatalogModel]:
    """The catalog models with a realtime rate whose kind answers on this endpoint; one
    this deployment has no realtime engine for is answered 501 (realtime/checks.py)."""
    return [model for model in catalog_all().values()
            if isinstance(kind_for(model), kind)
            and model.price.realtime_input_per_mtok is not None]


# Read from the raw body (DecideKind), not a CharField: a NUL is just a character here.
_INSTRUCTIONS = {"type": "string", "pattern": r"\S",
                 "description": "The question itself."}
QUESTION_SCHEMA: dict[str, Any] = {"oneOf": [
    {"type": "object", "required": ["type", "instructions", "criteria"],
     "properties": {"type": {"const": "choice"}, "instructions": _INSTRUCTIONS,
                    "criteria": {"type": "object", "minProperties": 2,
                                 "additionalProperties": {"type": "string"},
                                 "description": "Option key to its description."}}},
    {"type": "object", "required": ["type", "instructions"],
     "properties": {"type": {"const": "noul"}, "instructions": _INSTRUCTIONS,
                    "criteria": {"type": ["object", "null"], "additionalProperties": False,
                                 "properties": {"true": {"type": "string"},
                                                "false": {"type": "string"}},
                                 "description": "What a yes and a no mean."}}},
    {"type": "object", "required": ["type", "instructions", "criteria"],
     "properties": {"type": {"const": "score"}, "instructions": _INSTRUCTIONS,
                    "criteria": {"type": "array", "minItems": 2, "items": {"type": "string"},
                                 "description": "The levels, lowest first."}}},
]}



class EmbeddingsIn(FreshFields, Closed, serializers.Serializer):  # type: ignore[type-arg]
    """POST /realtime/v1/embeddings: OpenAI's embeddings request, text only."""

    model = serializers.CharField(max_length=100)
    input = DocumentedJSONField(
        openapi={"oneOf": [_TEXT, {"type": "array", "minItems": 1,
                                   "maxItems": REALTIME_MAX_INPUTS, "items": _TEXT}]},
        help_text=f"A string, or a list of at most {REALTIME_MAX_INPUTS} strings; each at most "
                  f"{REALTIME_MAX_INPUT_CHARS:,} characters, {REALTIME_MAX_TOTAL_CHARS:,} in "
                  "all (text only: no image or video parts).")
    dimensions = serializers.IntegerField(required=False, allow_null=True)
    encoding_format = DocumentedCharField(
        required=False, allow_null=True, max_length=32,
        openapi={"type": "string", "enum": list(ENCODING_FORMATS)},
        help_text="float, or base64: each vector as base64 of its little-endian float32 "
                  "values, as OpenAI answers it (what the OpenAI SDK asks for by default, "
                  "and decodes to floats).")
    user = DocumentedCharField(required=False, allow_blank=True, max_length=256,
                               openapi={"type": ["string", "number"], "pattern": NO_NUL},
                               help_text="Accepted for OpenAI compatibility; not used (a "
                                         "number is taken as its text).")

    @classmethod
    def openapi_constraints(cls) -> dict[str, Any]:
        """Each model's dimensions (EmbedKind.dimensions_problem)."""
        return {
            "oneOf": [{"title": model.id, "properties": {
                "model": {"const": model.id},
                "dimensions": {"minimum": model.dimensions_min,
                               "maximum": model.dimensions_native}}}
                for model in _realtime(EmbedKind)],
        }


class DecisionIn(FreshFields, Closed, serializers.Serializer):  # type: ignore[type-arg]
    """POST /realtime/v1/systemone: its fields, and no other (422 naming it, as every body
    of the API answers one). The rest is checked as a decision job row's is
    (DecideKind.realtime_request), from the body as sent."""

    model = serializers.CharField(max_length=100)
    state = DocumentedJSONField(openapi={"type": ["string", "object"]},
                                help_text="The text: a string, or an object read as its "
                                          "compact JSON.")
    questions = DocumentedJSONField(
        openapi={"type": "object", "minProperties": 1,
                 "additionalProperties": QUESTION_SCHEMA},
        help_text="Named questions, as in a decision job row; each answer comes back under "
                  "its name.")
    lang = serializers.CharField(required=False, allow_null=True, allow_blank=True,
                                 help_text="A language code such as \"de\", to settle the "
                                           "checkpoint a text's script does not.")

    @classmethod
    def openapi_constraints(cls) -> dict[str, Any]:
        """decision_row's rules (inference/rows/decisions.py), each model's limits, and the
        question shapes the model answers; a question it refuses for its options' length
        (the option budget) is 422 with the model's message."""
        return {
            "oneOf": [{"title": model.id, "properties": {
                "model": {"const": model.id},
                "state": {"maxLength": model.max_state_chars,
                          "description": "An object counts as its compact JSON."},
                "questions": {"maxProperties": model.max_questions}}}
                for model in _realtime(DecideKind)],
        }


# -- answers -------------------------------------------------------------------------------

class ModelOut(serializers.Serializer):  # type: ignore[type-arg]
    id = serializers.CharField(source="model.id")
    object = Const("model")
    # The catalog records no creation time for a model; OpenAI's field stays an int.
    created = Const(0, openapi={"type": "integer"})
    owned_by = Const("anex")
    task = serializers.SerializerMethodField()
    realtime = serializers.BooleanField(help_text="Served by the realtime API (else batch "
                                                  "only).")
    local = serializers.BooleanField(help_text="Answered by a small checkpoint built on this "
                                               "deployment (a local stand-in), not the "
                                               "model's published weights.")

    @extend_schema_field({"type": "string", "enum": [kind.task for kind in kinds_all()]})
    def get_task(self, listed: ListedModel) -> str:
        return kind_for(listed.model).task


class ModelListOut(serializers.Serializer):  # type: ignore[type-arg]
    """GET /realtime/v1/models: OpenAI's list object, of the models this key may use."""

    object = Const("list")
    data = ModelOut(many=True, source="*")  # type: ignore[assignment]  # a field, not .data


class EmbeddingOut(serializers.Serializer):  # type: ignore[type-arg]
    object = Const("embedding")
    index = serializers.IntegerField()
    embedding = Verbatim(openapi={"oneOf": [{"type": "array", "items": {"type": "number"}},
                                            {"type": "string", "format": "byte"}],
                                  "description": "Unit length: floats, or with "
                                                 "encoding_format base64 the base64 of its "
                                                 "little-endian float32 values."})


class EmbeddingsUsageOut(serializers.Serializer):  # type: ignore[type-arg]
    prompt_tokens = serializers.IntegerField()
    total_tokens = serializers.IntegerField()


class EmbeddingsOut(serializers.Serializer):  # type: ignore[type-arg]
    """OpenAI's embeddings list object (inference/kinds/embed.py, embeddings_body)."""

    object = Const("list")
    model = serializers.CharField()
    data = EmbeddingOut(many=True)  # type: ignore[assignment]  # a field, not .data
    usage = EmbeddingsUsageOut()


class DecisionUsageOut(serializers.Serializer):  # type: ignore[type-arg]
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()


class DecisionRoutingOut(serializers.Serializer):  # type: ignore[type-arg]
    model = serializers.CharField(help_text="The internal checkpoint that answered.")
    reason = serializers.CharField()


class DecisionOut(serializers.Serializer):  # type: ignore[type-arg]
    """The reference's decision answer (inference/kinds/decide.py, answer_body)."""

    model = serializers.CharField()
    answers = Verbatim(openapi={"type": "object", "additionalProperties": {"type": "object"},
                                "description": "One answer per question, keyed by its name; "
                                               "a field beyond the reference's is the "
                                               "model's own."})
    routing = DecisionRoutingOut()
    usage = DecisionUsageOut()


# -- answers without a serializer per request ----------------------------------------------
# The two POST answers are built by these instead of EmbeddingsOut(body).data and
# DecisionOut(body).data: the same fields, order and conversions (str for a CharField, int
# for an IntegerField, a Const's value, a Verbatim's value as it is), without the deep copy
# of every field that a serializer instance makes (a tenth of an embedding request's CPU).
# The serializers stay the schema's; tests/unit/test_realtime_wire.py holds the two equal.

def _str(value: Any) -> str | None:
    return None if value is None else str(value)  # a serializer answers None as null


def _int(value: Any) -> int | None:
    return None if value is None else int(value)


def embeddings_out(body: dict[str, Any]) -> dict[str, Any]:
    """EmbeddingsOut(body).data."""
    data, usage = body["data"], body["usage"]
    return {"object": "list", "model": _str(body["model"]),
            "data": None if data is None else [
                {"object": "embedding", "index": _int(item["index"]),
                 "embedding": item["embedding"]} for item in data],
            "usage": None if usage is None else {
                "prompt_tokens": _int(usage["prompt_tokens"]),
                "total_tokens": _int(usage["total_tokens"])}}


def decision_out(body: dict[str, Any]) -> dict[str, Any]:
    """DecisionOut(body).data."""
    routing, usage = body["routing"], body["usage"]
    return {"model": _str(body["model"]), "answers": body["answers"],
            "routing": None if routing is None else {
                "model": _str(routing["model"]), "reason": _str(routing["reason"])},
            "usage": None if usage is None else {
                "input_tokens": _int(usage["input_tokens"]),
                "output_tokens": _int(usage["output_tokens"])}}
