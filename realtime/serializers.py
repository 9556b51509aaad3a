"""The realtime API's wire shapes: input serializers check shape only (a missing or wrongly
typed field is 422); the reference's rules are the task kinds' (inference/kinds). The response
shapes are OpenAI's (models, embeddings) and the reference's (decisions), as OpenAPI."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from inference.kinds import kind_for
from realtime.selectors import ListedModel


class EmbeddingsIn(serializers.Serializer):
    model = serializers.CharField(max_length=100)
    input = serializers.JSONField(help_text="A string, or a list of at most 128 strings.")
    dimensions = serializers.IntegerField(required=False, allow_null=True)
    encoding_format = serializers.CharField(required=False, allow_null=True, max_length=32,
                                            help_text="float (base64, which the OpenAI SDK "
                                                      "sends by default, is answered with "
                                                      "floats too).")
    user = serializers.CharField(required=False, allow_blank=True, max_length=256,
                                 help_text="Accepted for OpenAI compatibility; not used.")


class DecisionIn(serializers.Serializer):
    """For the schema only: the body is checked as a decision job row's is
    (DecideKind.realtime_request), which names an unknown field rather than dropping it."""

    model = serializers.CharField(max_length=100)
    state = serializers.JSONField(help_text="The text: a string, or an object read as its "
                                            "JSON (at most 50,000 characters).")
    questions = serializers.JSONField(help_text="Named questions (at most 64), as in a "
                                                "decision job row.")
    lang = serializers.CharField(required=False, help_text="A language code such as \"de\".")


def model_out(listed: ListedModel) -> dict[str, Any]:
    return {"id": listed.model.id, "object": "model",
            # The catalog records no creation time for a model; OpenAI's field stays an int.
            "created": 0, "owned_by": "anex",
            "task": kind_for(listed.model).task, "realtime": listed.realtime, "local": listed.local}


MODEL_SCHEMA = {
    "type": "object",
    "required": ["id", "object", "created", "owned_by", "task", "realtime", "local"],
    "properties": {
        "id": {"type": "string"}, "object": {"type": "string", "enum": ["model"]},
        "created": {"type": "integer"}, "owned_by": {"type": "string"},
        "task": {"type": "string", "enum": ["chat", "embed", "decide"]},
        "realtime": {"type": "boolean",
                     "description": "Served by the realtime API (else batch only)."},
        "local": {"type": "boolean",
                  "description": "Answered by a small checkpoint built on this deployment "
                                 "(a local stand-in), not the model's published weights."},
    },
}
MODELS_SCHEMA = {
    "type": "object", "required": ["object", "data"],
    "properties": {"object": {"type": "string", "enum": ["list"]},
                   "data": {"type": "array", "items": MODEL_SCHEMA}},
}
EMBEDDINGS_SCHEMA = {
    "type": "object", "required": ["object", "data", "model", "usage"],
    "properties": {
        "object": {"type": "string", "enum": ["list"]},
        "data": {"type": "array", "items": {
            "type": "object", "required": ["object", "index", "embedding"],
            "properties": {"object": {"type": "string", "enum": ["embedding"]},
                           "index": {"type": "integer"},
                           "embedding": {"type": "array", "items": {"type": "number"},
                                         "description": "Unit length."}}}},
        "model": {"type": "string"},
        "usage": {"type": "object", "required": ["prompt_tokens", "total_tokens"],
                  "properties": {"prompt_tokens": {"type": "integer"},
                                 "total_tokens": {"type": "integer"}}},
    },
}
DECISION_SCHEMA = {
    "type": "object", "required": ["model", "answers", "usage", "routing"],
    "properties": {
        "model": {"type": "string"},
        "answers": {"type": "object", "additionalProperties": {"type": "object"},
                    "description": "One answer per question, keyed by its name."},
        "usage": {"type": "object", "required": ["input_tokens", "output_tokens"],
                  "properties": {"input_tokens": {"type": "integer"},
                                 "output_tokens": {"type": "integer"}}},
        "routing": {"type": "object", "required": ["model", "reason"],
                    "properties": {"model": {"type": "string"},
                                   "reason": {"type": "string"}}},
    },
}
