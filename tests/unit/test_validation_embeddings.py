"""Embedding rows: the input contract and its exact messages, per-row dimensions, media on
the VL models, and usage that prices each row text-only or with media."""

from __future__ import annotations

from decimal import Decimal

import pytest

from inference.pricing import Usage, usage_cost_usd
from tests.unit.test_validation_media_files import data_uri, mp4_bytes, png_bytes
from tests.unit.test_validation_support import check, embed_line, model, refusal

SINGLE = ("embeddings input must be a single string per row, not a list (submit one row per "
          "input)")
IMAGE = {"type": "image_url", "image_url": {"url": "https://e.com/photo.jpg"}}
VIDEO = {"type": "video_url", "video_url": {"url": "https://e.com/clip.mp4",
                                            "duration_seconds": 10}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
VL8, VL2, TEXT8 = "qwen3-vl-embedding-8b", "qwen3-vl-embedding-2b", "qwen3-embedding-8b"


@pytest.mark.parametrize("model_id,line,expected", [
    (VL8, embed_line("e", ["one", "two"]), f"Row 'e': {SINGLE}"),
    (VL8, embed_line("e", [{"type": "text", "text": "a"}, "b"]), f"Row 'e': {SINGLE}"),
    (TEXT8, embed_line("e", ["one"]), f"Row 'e': {SINGLE}"),
    (TEXT8, embed_line("e", [{"type": "text", "text": "a"}]), f"Row 'e': {SINGLE}"),
    (VL8, embed_line("e", "x", messages=[{"role": "user", "content": "x"}]),
     "Row 'e': an embeddings request carries 'input', not 'messages'"),
    (VL8, {"custom_id": "e", "method": "POST", "url": "/v1/embeddings",
           "body": {"messages": [{"role": "user", "content": "x"}]}},
     "Row 'e': an embeddings request carries 'input', not 'messages'"),
    (TEXT8, embed_line("e", "x", encoding_format="base64"),
     "Row 'e': encoding_format must be \"float\", not 'base64'; vectors are returned as "
     "floats"),
    (TEXT8, embed_line("e", [IMAGE]),
     "Row 'e': model 'qwen3-embedding-8b' has no encoder for image input (it takes text); "
     "choose a model that takes image"),
    (TEXT8, embed_line("e", [{"type": "text", "text": "a"}, VIDEO]),
     "Row 'e': model 'qwen3-embedding-8b' has no encoder for video input (it takes text); "
     "choose a model that takes video"),
    (TEXT8, embed_line("e", [AUDIO]),
     "Row 'e': model 'qwen3-embedding-8b' has no encoder for audio input: no embedding model "
     "takes audio"),
    (VL8, embed_line("e", [{"type": "text", "text": "a"}, AUDIO]),
     "Row 'e': model 'qwen3-vl-embedding-8b' has no encoder for audio input: no embedding "
     "model takes audio"),
    (VL2, embed_line("e", [{"type": "audio_url", "audio_url": {"url": "https://e.com/a.mp3"}}]),
     "Row 'e': model 'qwen3-vl-embedding-2b' has no encoder for audio input: no embedding "
     "model takes audio"),
    (VL8, embed_line("e", [{"type": ["input_audio"]}]),
     "Row 'e': unsupported content part type '['input_audio']': supported types are text, "
     "image_url, video_url"),
    (VL8, embed_line("e", [{"type": "input_image", "image_url": "x"}]),
     "Row 'e': unsupported content part type 'input_image': supported types are text, "
     "image_url, video_url"),
    (VL8, embed_line("e", [{"type": "text", "text": ""}]),
     "Row 'e': embeddings input needs at least one part with media or non-empty text"),
    (VL8, embed_line("e", []),
     "Row 'e': embeddings input needs at least one part with media or non-empty text"),
    (VL8, embed_line("e", ""), "Row 'e': embeddings input must be a non-empty string"),
    (VL8, {"custom_id": "e", "method": "POST", "url": "/v1/embeddings", "body": {}},
     "Row 'e': an embeddings request needs 'input': a single non-empty string"),
    (VL8, embed_line("e", 5), "Row 'e': embeddings input must be a single non-empty string"),
    (VL8, embed_line("e", "x", dimensions=32),
     "Row 'e': dimensions must be a whole number from 64 to 4096 on model "
     "'qwen3-vl-embedding-8b', not 32"),
    (VL2, embed_line("e", "x", dimensions=4096),
     "Row 'e': dimensions must be a whole number from 64 to 2048 on model "
     "'qwen3-vl-embedding-2b', not 4096"),
    (TEXT8, embed_line("e", "x", dimensions=31),
     "Row 'e': dimensions must be a whole number from 32 to 4096 on model "
     "'qwen3-embedding-8b', not 31"),
    (TEXT8, embed_line("e", "x", dimensions="64"),
     "Row 'e': dimensions must be a whole number from 32 to 4096 on model "
     "'qwen3-embedding-8b', not '64'"),
    (TEXT8, embed_line("e", "x", dimensions=True),
     "Row 'e': dimensions must be a whole number from 32 to 4096 on model "
     "'qwen3-embedding-8b', not True"),
    (TEXT8, embed_line("e", "w " * 32_768),
     "Row 'e' is too long: 32,769 input tokens exceeds the 32,768-token maximum that model "
     "'qwen3-embedding-8b' can serve. Shorten or split this row."),
    (VL8, embed_line("e", [{"type": "video_url", "video_url": {"url": "https://e.com/c.mp4",
                                                               "duration_seconds": 200}}]),
     "Row 'e': video is 200 s; at the fixed 1 fps the longest clip qwen3-vl-embedding-8b "
     "takes is 127 s. Shorten the clip."),
    (VL8, embed_line("e", [{"type": "image_url", "image_url": {
        "url": "data:application/octet-stream;base64," + "A" * 28_000_000}}]),
     "Row 'e': an embedded image exceeds the size limit (max 20 MB)"),
])
def test_embedding_input_rules(model_id: str, line: dict[str, object], expected: str) -> None:
    assert refusal(model_id, [line]) == expected


@pytest.mark.parametrize("model_id,line", [
    (TEXT8, embed_line("e", "x", dimensions=32, encoding_format="float", user="u",
                       model="ignored")),
    (VL2, embed_line("e", "x", dimensions=2048)),
    (VL8, embed_line("e", [{"type": "text", "text": "a caption"}])),
    (VL8, embed_line("e", [{"type": "image_url",
                            "image_url": {"url": data_uri("image/png", png_bytes())}}])),
])
def test_embedding_rows_that_pass(model_id: str, line: dict[str, object]) -> None:
    assert check(model_id, [line]).rows == 1


def test_the_job_level_video_fps_does_not_reach_embedding_rows() -> None:
    clip = {"type": "video_url", "video_url": {"url": data_uri("video/mp4", mp4_bytes(20))}}
    report = check(VL8, [embed_line("e", [clip])], video_fps=20)
    assert report.usage.media_row_tokens == 7 + 21 * 256  # 1 fps: 21 frames


def test_embedding_usage_is_sorted_by_what_each_row_carries() -> None:
    rows = [
        embed_line("text", "a b c"),                                    # 3 + end-of-text
        embed_line("image", [{"type": "text", "text": "caption here"}, IMAGE]),
        embed_line("video", [VIDEO]),
        embed_line("both", [IMAGE, VIDEO]),
        embed_line("text-part", [{"type": "text", "text": "just words"}]),
    ]
    report = check(VL8, rows)
    # The media-row template ("<|im_start|>system\nRepresent the user's input.<|im_end|>\n
    # <|im_start|>user\n...<|im_end|>\n") is 7 words around the text; an image is 1,280
    # tokens and 10 s of video at 1 fps 11 frames of 256.
    image_row = 8 + 1280
    video_row = 7 + 11 * 256
    both_row = 7 + 1280 + 11 * 256
    text_part_row = 8
    media_rows = image_row + video_row + both_row
    assert report.usage == Usage(input_tokens=4 + text_part_row, media_row_tokens=media_rows,
                                 images=2, clips=2, media_seconds=Decimal(20))
    assert report.endpoint == "/v1/embeddings"
    assert report.output_headroom is None and report.media_rows == 3
    # Text-only rows at $0.03 per 1M, rows with any media at $0.08 (their text included),
    # plus $4 per million images and $60 per million video clips.
    cost = usage_cost_usd(model(VL8), report.usage)
    assert cost == (Decimal(12) * Decimal("0.03") + Decimal(media_rows) * Decimal("0.08")
                    ) / 1_000_000 + 2 * Decimal("0.000004") + 2 * Decimal("0.00006")


def test_a_text_embedding_job_bills_input_tokens_only() -> None:
    report = check(TEXT8, [embed_line("a", "one two"), embed_line("b", "three")])
    assert report.usage == Usage(input_tokens=3 + 2)
