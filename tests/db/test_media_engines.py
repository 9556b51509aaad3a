"""Media rows through the real chunk path and the real engines (issue 41 items 2 and 4):
jobs.services.running.execute with the local media checkpoints, from the row as the
customer sent it (data: URIs) to its result and its usage, as a worker runs a chunk.

Takes the engine fixtures, so it runs in the engine tier (tests/conftest.py). The media
are made here (tests/media.py); tests/db/test_media_serving.py holds the same path to its
fetching and decoding rules with a fake engine."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from pytest_django import Settings

from console.models import Organization
from inference.catalog import CatalogModel, model_get
from inference.engines import ChatEngine
from inference.kinds.base import InputRow
from inference.pricing import Usage, usage_from_json
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.running import execute
from tests.media import clip, data_uri, noise_picture, picture, tone

pytestmark = pytest.mark.django_db
RED, BLUE = (230, 20, 20), (20, 20, 230)
QUESTION = "What is the main colour?"


@pytest.fixture
def served_locally(settings: Settings, checkpoint_dirs: dict[str, Path]) -> None:
    """The worker's checkpoints: the local media models (their engines are the session's,
    shared by checkpoint)."""
    settings.ANEX_CHECKPOINTS = {**settings.ANEX_CHECKPOINTS,
                                 "tiny-vl": checkpoint_dirs["tiny-vl"],
                                 "tiny-audio": checkpoint_dirs["tiny-audio"]}


def catalog_model(model_id: str) -> CatalogModel:
    model = model_get(model_id)
    assert model is not None
    return model


def chat_job(organization: Organization, model: str) -> Job:
    return Job.objects.create(organization=organization, model=model, task_type="chat",
                              status=JobStatus.IN_PROGRESS, max_output_tokens=16,
                              reasoning=False)


def row(index: int, *parts: dict[str, Any], text: str = QUESTION) -> InputRow:
    content: Any = [{"type": "text", "text": text}, *parts] if parts else text
    return InputRow(index, f"r{index}", {"messages": [{"role": "user", "content": content}]})


def image(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def content(result: dict[str, Any]) -> str:
    assert result["outcome"] == "success", result
    return str(result["body"]["choices"][0]["message"]["content"])


def prompt_tokens(result: dict[str, Any]) -> int:
    return int(result["body"]["usage"]["prompt_tokens"])


def test_image_and_video_rows_on_tiny_vl_answer_billed_at_the_catalogs_tokens(
        organization: Organization, served_locally: None, vl_engine: ChatEngine) -> None:
    vl = catalog_model("tiny-vl")
    whole = noise_picture(3, size=(256, 192), fmt="PNG")
    video = clip([BLUE] * 25, fps=10)  # 2.4 s: frames at 0, 1, 2 s and its last
    rows = [row(0),
            row(1, image(data_uri(picture(RED, fmt="PNG"), "image/png"))),
            row(2, image(data_uri(picture(BLUE, fmt="JPEG"), "image/jpeg"))),
            row(3, {"type": "video_url", "video_url": {"url": data_uri(video, "video/mp4")}}),
            row(4, image(data_uri(whole[:len(whole) // 2], "image/png")))]  # cut off
    results, usage = execute(chat_job(organization, "tiny-vl"), rows)
    text, red, blue, clip_row, corrupt = results
    # Each media row answered from its media: two pictures, two answers.
    assert (content(red), content(blue), content(clip_row)) == ("Red.", "Blue.", "Blue.")
    # Its prompt is the same text's plus the catalog's media tokens, as billed.
    assert prompt_tokens(red) - prompt_tokens(text) == vl.media.image_tokens
    assert prompt_tokens(blue) - prompt_tokens(text) == vl.media.image_tokens
    frames = math.ceil(2.4 * (vl.media.video_fps_default or 1)) + 1
    assert prompt_tokens(clip_row) - prompt_tokens(text) \
        == frames * (vl.media.video_frame_tokens or 0)
    assert usage_from_json(red["usage"]).media_tokens == vl.media.image_tokens
    assert usage_from_json(clip_row["usage"]).clips == 1
    # The corrupt picture failed its row alone, unbilled.
    assert corrupt["outcome"] == "error" and corrupt["body"] is None
    assert (corrupt["error"]["type"], corrupt["error"]["param"]) == (
        "invalid_request_error", "messages[0].content[1]")
    assert usage_from_json(corrupt["usage"]) == Usage()
    assert usage.images == 2 and usage.clips == 1


def test_audio_rows_on_tiny_audio_hear_their_tones(
        organization: Organization, served_locally: None, audio_engine: ChatEngine) -> None:
    audio = catalog_model("tiny-audio")
    question = "Is the tone high or low?"

    def tone_part(frequency: float) -> dict[str, Any]:
        wav = tone(frequency, seconds=2, rate=44_100)  # resampled to 16 kHz by the worker
        return {"type": "input_audio", "input_audio": {
            "data": data_uri(wav, "audio/wav").partition(",")[2], "format": "wav"}}

    broken = tone(440)
    rows = [row(0, text=question), row(1, tone_part(220), text=question),
            row(2, tone_part(1_760), text=question),
            row(3, {"type": "input_audio", "input_audio": {
                "data": data_uri(broken[:22] + b"\x00\x00" + broken[24:], "x")
                .partition(",")[2], "format": "wav"}}, text=question)]
    results, usage = execute(chat_job(organization, "tiny-audio"), rows)
    text, low, high, corrupt = results
    assert (content(low), content(high)) == ("Low.", "High.")
    per_second = audio.media.audio_tokens_per_second
    assert per_second is not None
    for answered in (low, high):
        assert prompt_tokens(answered) - prompt_tokens(text) == math.ceil(2 * per_second)
    assert corrupt["outcome"] == "error"
    assert corrupt["error"]["type"] == "invalid_request_error"
    assert usage_from_json(corrupt["usage"]) == Usage()
    assert usage.clips == 2
