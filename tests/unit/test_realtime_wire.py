"""The realtime answers' builders (realtime.serializers embeddings_out, decision_out) give
exactly what their output serializers give: the same fields, order, types and bytes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from inference.engines import DecisionOutcome
from inference.kinds.decide import answer_body
from inference.kinds.embed import embeddings_body
from realtime.serializers import DecisionOut, EmbeddingsOut, decision_out, embeddings_out
from realtime.services import base64_vector


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
