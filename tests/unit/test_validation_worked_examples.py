"""The reference's worked examples (batch-api-reference.txt, GET /jobs/{id} and Errors;
docs/dev/decisions/2026-12-01-models-limits-and-pricing.md), reproduced word for word from the one
catalog."""

from __future__ import annotations

from decimal import Decimal

from inference.pricing import Usage, price
from tests.unit.test_validation_support import chat_line, check, model, refusal


def test_a_video_longer_than_the_model_takes_at_the_requested_rate() -> None:
    # 131,072 tokens for a row with video on qwen3.8-27b, 168 a frame: 780 frames, and
    # ceil(seconds x 20) + 1 <= 780 holds up to 38.95 s.
    clip = {"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4",
                                               "duration_seconds": 45}}
    line = chat_line("clip-7", [{"type": "text", "text": "What happens here?"}, clip])
    assert refusal("qwen3.8-27b", [line], video_fps=20) == (
        "Row 'clip-7': video is 45 s; at the requested 20 fps the longest clip qwen3.8-27b "
        "takes is 38 s. Shorten the clip or lower video_fps.")


def test_an_audio_clip_over_the_models_duration_cap() -> None:
    clip = {"type": "audio_url", "audio_url": {"url": "https://example.com/clip.mp3",
                                               "duration_seconds": 45}}
    assert refusal("gemma4-12b", [chat_line("x", [clip])]) == (
        "Row 'x': audio duration 45s exceeds the 30s maximum for model 'gemma4-12b'. Shorten "
        "or split this audio input.")


def test_a_row_that_does_not_fit_the_context_with_its_media() -> None:
    # An undeclared hosted clip runs the 40-minute ceiling: 2,400 s x 12.5 = 30,000 tokens,
    # plus 7,496 words of text and 4 template tokens = 37,500.
    clip = {"type": "audio_url", "audio_url": {"url": "https://example.com/recording"}}
    line = chat_line("x", [{"type": "text", "text": "w " * 7_496}, clip])
    assert refusal("nemotron-3-nano-omni-30b", [line]) == (
        "Row 'x' is too long: 37,500 input tokens (including media) exceeds the 32,768-token "
        "maximum that model 'nemotron-3-nano-omni-30b' can serve with audio input. Shorten or "
        "split this row.")


def test_an_undeclared_hosted_clip_on_nemotron_is_priced_as_40_minutes() -> None:
    clip = {"type": "audio_url", "audio_url": {"url": "https://example.com/clip.mp3"}}
    report = check("nemotron-3-nano-omni-30b", [chat_line("x", [clip])])
    assert report.usage == Usage(media_tokens=30_000, clips=1, media_seconds=Decimal(2400),
                                 input_tokens=4)
    declared = {"type": "audio_url", "audio_url": {"url": "https://example.com/clip.mp3",
                                                   "duration_seconds": 20}}
    accurate = check("nemotron-3-nano-omni-30b", [chat_line("x", [declared])])
    assert accurate.usage.media_seconds == 20 and accurate.estimated_clips == 0
    nemotron = model("nemotron-3-nano-omni-30b")
    assert price(nemotron, report.usage).exact_usd > price(nemotron, accurate.usage).exact_usd
