"""The realtime answers' builders (realtime.serializers embeddings_out, decision_out) give
exactly what their output serializers give: the same fields, order, types and bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework import serializers

from inference.engines import DecisionOutcome
from inference.kinds.decide import answer_body
from inference.kinds.embed import embeddings_body
from realtime.serializers import (
    DecisionOut,
    EmbeddingsIn,
    EmbeddingsOut,
    decision_out,
    embeddings_out,
)
from realtime.services.requests import base64_vector


def _same(built: dict[str, Any], serialized: Any) -> None:
    # json.dumps keeps the keys' order: equal text is equal fields, order and values
    assert json.dumps(built) == json.dumps(serialized)


@pytest.mark.parametrize("body", [
    embeddings_body("all-minilm-l6-v2", [[1.0, 0.0, -0.5]], 7),
    embeddings_body("all-minilm-l6-v2", [[0.6, 0.8], [0.8, 0.6], [1.0, 0.0]], 12),
    embeddings_body("qwen3-embedding-8b", [base64_vector([0.6, 0.8])], 3),
    embeddings_body("all-minilm-l6-v2", [], 0),
    # what a serializer converts: a CharField's str, an IntegerField's int, an extra field
    {"object": "ignored", "model": 5, "extra": 1,
     "data": [{"object": "x", "index": True, "embedding": [1.0], "more": 2}],
     "usage": {"prompt_tokens": 3.0, "total_tokens": 3, "x": 0}},
    {"model": None, "data": [{"index": None, "embedding": None}], "usage": None},
    {"model": "m", "data": None, "usage": {"prompt_tokens": None, "total_tokens": 1}},
])
def test_embeddings_out_is_the_serializers_data(body: dict[str, Any]) -> None:
    _same(embeddings_out(body), EmbeddingsOut(body).data)


@pytest.mark.parametrize("body", [
    answer_body("laya", DecisionOutcome(
        answers={"urgent": {"type": "noul", "noul": 0.9, "confidence": 0.9}},
        input_tokens=21, routing={"model": "english", "reason": "Latin"})),
    answer_body("laya", DecisionOutcome(
        answers={"a": {"type": "score", "score": 2}, "b": {"type": "choice", "choice": "x"}},
        input_tokens=0, routing={"model": "multilingual", "reason": "de", "extra": "1"})),
    {"model": 1, "answers": {}, "routing": {"reason": 2, "model": None},
     "usage": {"output_tokens": 0, "input_tokens": 4.0}, "extra": True},
    {"model": None, "answers": None, "routing": None, "usage": None},
])
def test_decision_out_is_the_serializers_data(body: dict[str, Any]) -> None:
    _same(decision_out(body), DecisionOut(body).data)


class _DeepCopied(EmbeddingsIn):
    """EmbeddingsIn with DRF's own field copies (every argument deep-copied)."""

    def get_fields(self) -> dict[str, Any]:
        return serializers.Serializer.get_fields(self)


@pytest.mark.parametrize("body", [
    {"model": "all-minilm-l6-v2", "input": "a query"},
    {"model": " all-minilm-l6-v2 ", "input": ["a", "b"], "dimensions": 64,
     "encoding_format": "base64", "user": 12},
    {"model": "m", "input": None, "dimensions": None, "encoding_format": None, "user": ""},
    {"model": "", "input": "x"},
    {"model": "x" * 101, "input": "x", "encoding_format": "y" * 33},
    {"model": "bad\x00", "input": "x", "dimensions": "7", "user": "u\x00"},
    {"model": ["a"], "input": "x", "dimensions": True},
    {"model": 5, "input": {"a": 1}, "dimensions": 1.5, "extra": 1},
    {"input": "x"},
    {},
    [],
    "text",
])
def test_the_embeddings_body_is_judged_as_with_deep_copied_fields(body: Any) -> None:
    fresh, reference = EmbeddingsIn(data=body), _DeepCopied(data=body)
    assert fresh.is_valid() == reference.is_valid()
    assert json.dumps(fresh.errors) == json.dumps(reference.errors)
    if reference.is_valid():
        assert fresh.validated_data == reference.validated_data


def test_each_request_gets_its_own_fields_and_the_declared_ones_stay_as_they_were() -> None:
    declared = {name: dict(vars(field)["_kwargs"]) for name, field in
                EmbeddingsIn._declared_fields.items()}
    first, second = EmbeddingsIn(data={}), EmbeddingsIn(data={})
    assert all(first.fields[name] is not second.fields[name] for name in declared)
    assert first.fields["model"].parent is first and second.fields["model"].parent is second
    first.is_valid()
    assert {name: vars(field)["_kwargs"] for name, field in
            EmbeddingsIn._declared_fields.items()} == declared
