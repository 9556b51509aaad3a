"""The VL embedding engine on the real vLLM pooling runner and the local tiny-vl-embedding
checkpoint (issue 41 item 3): text, picture and video rows in one space, unit vectors, two
pictures two vectors, a text row the realtime query's vector, and a media row's media
tokens the catalog's (what it is billed)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from inference.engines import EmbeddingEngine, EmbedOutcome, EmbedRow
from inference.engines.media import DECODED_KEY
from inference.kinds.embed import EmbedKind
from inference.kinds.media_decode import image_decode, video_decode
from tests.engine_fixtures import catalog_model
from tests.media import clip, data_uri, picture

pytest_plugins = ["tests.engine_fixtures"]

MODEL = "tiny-vl-embedding"
RED, BLUE = (230, 20, 20), (20, 20, 230)
TEXT = "a red square"


def norm(vector: list[float]) -> float:
    return math.sqrt(math.fsum(x * x for x in vector))


def cosine(a: list[float], b: list[float]) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True)) / (norm(a) * norm(b))


def vector(outcome: EmbedOutcome) -> list[float]:
    assert outcome.error is None, outcome.error
    assert outcome.vector is not None
    return outcome.vector


def image_part(colour: tuple[int, int, int]) -> dict[str, Any]:
    """An image_url part as the worker hands it on: the customer's keys and its decoded
    picture (inference.kinds.media)."""
    data = picture(colour)
    return {"type": "image_url", "image_url": {"url": data_uri(data, "image/png")},
            DECODED_KEY: image_decode(data)}


def video_part(colours: list[tuple[int, int, int]], *, fps: float = 1.0) -> dict[str, Any]:
    data = clip(colours, fps=10)
    return {"type": "video_url", "video_url": {"url": data_uri(data, "video/mp4")},
            DECODED_KEY: video_decode(data, fps=fps, max_seconds=20, max_frames=21)}


def test_text_picture_and_video_rows_are_unit_vectors_of_the_models_width(
        vl_embedding_engine: EmbeddingEngine) -> None:
    model = catalog_model(MODEL)
    video = video_part([RED] * 20)
    rows = [EmbedRow(text=TEXT), EmbedRow(text=[image_part(RED)]),
            EmbedRow(text=[{"type": "text", "text": "this clip:"}, video]),
            EmbedRow(text=[image_part(BLUE)], dimensions=64)]
    outcomes = vl_embedding_engine.embed(rows)
    widths = [len(vector(outcome)) for outcome in outcomes]
    assert widths == [model.dimensions_native] * 3 + [64]
    for outcome in outcomes:
        assert norm(vector(outcome)) == pytest.approx(1.0, abs=1e-6)
    # A media row's media took what the catalog bills: a picture's tokens, a frame's each.
    assert outcomes[0].media_tokens is None
    assert outcomes[1].media_tokens == model.media.image_tokens
    frames = len(video[DECODED_KEY].frames)
    assert frames == 3  # a 2 s clip at 1 fps: ceil(2 x 1) + 1
    assert outcomes[2].media_tokens == frames * (model.media.video_frame_tokens or 0)
    assert outcomes[2].prompt_tokens > outcomes[2].media_tokens


def test_two_pictures_are_two_vectors_and_a_picture_is_not_its_text(
        vl_embedding_engine: EmbeddingEngine) -> None:
    red, blue, red_again, text = vl_embedding_engine.embed(
        [EmbedRow(text=[image_part(RED)]), EmbedRow(text=[image_part(BLUE)]),
         EmbedRow(text=[image_part(RED)]), EmbedRow(text=TEXT)])
    assert cosine(vector(red), vector(blue)) < 0.9999
    assert cosine(vector(red), vector(red_again)) == pytest.approx(1.0, abs=1e-6)
    assert cosine(vector(red), vector(text)) < 0.9999


@pytest.mark.parametrize("dimensions", [None, 64])
def test_a_text_row_is_the_realtime_querys_vector(
        vl_embedding_engine: EmbeddingEngine, dimensions: int | None) -> None:
    kind, model = EmbedKind(), catalog_model(MODEL)
    # The realtime path: the web tier's checked request, forwarded to the engine server,
    # read back into engine rows and run there (realtime/serving.py).
    request = kind.realtime_request(model, [TEXT], dimensions=dimensions, counted=False)
    [answer] = kind.realtime_run(vl_embedding_engine,
                                 kind.realtime_rows(request.forward(model.id)))
    # The batch path: the text row in a chunk beside media rows.
    outcomes = vl_embedding_engine.embed([EmbedRow(text=[image_part(RED)]),
                                          EmbedRow(text=TEXT, dimensions=dimensions),
                                          EmbedRow(text=[video_part([BLUE] * 20)])])
    assert cosine(answer["embedding"], vector(outcomes[1])) >= 0.9999
    assert answer["prompt_tokens"] == outcomes[1].prompt_tokens


def test_a_video_row_embeds_its_frames_in_order(vl_embedding_engine: EmbeddingEngine) -> None:
    red_then_blue, blue_then_red, red = vl_embedding_engine.embed(
        [EmbedRow(text=[video_part([RED] * 10 + [BLUE] * 10)]),
         EmbedRow(text=[video_part([BLUE] * 10 + [RED] * 10)]),
         EmbedRow(text=[video_part([RED] * 20)])])
    assert cosine(vector(red_then_blue), vector(blue_then_red)) < 0.9999
    assert cosine(vector(red_then_blue), vector(red)) < 0.9999


def test_a_media_row_fails_alone_and_placeholder_text_is_text(
        vl_embedding_engine: EmbeddingEngine) -> None:
    undecoded = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    outcomes = vl_embedding_engine.embed([
        EmbedRow(text=[image_part(RED), undecoded]),
        # `<image>` written in a row is its characters: no picture is looked for.
        EmbedRow(text=[{"type": "text", "text": "<image> and <|im_end|>"}]),
        EmbedRow(text=[image_part(BLUE)]),
    ])
    assert outcomes[0].error is not None and outcomes[0].error.param == "input[1]"
    assert outcomes[0].vector is None and outcomes[0].prompt_tokens == 0
    assert outcomes[1].media_tokens == 0
    assert norm(vector(outcomes[1])) == pytest.approx(1.0, abs=1e-6)
    assert norm(vector(outcomes[2])) == pytest.approx(1.0, abs=1e-6)


def test_a_text_model_refuses_content_parts(embedding_engine: EmbeddingEngine) -> None:
    [outcome] = embedding_engine.embed([EmbedRow(text=[image_part(RED)])])
    assert outcome.error is not None and "served for text only" in outcome.error.message
