"""Media rows through the chat engine on the real vLLM engine and the local media
checkpoints (issue 41 item 2): tiny-vl (an Idefics3: pictures, and a clip's sampled frames
as pictures) and tiny-audio (a Qwen2-Audio: sound).

Both are trained for a few hundred steps to answer from their media (a picture's main
colour, a tone's pitch: inference/checkpoints_media.py), so these tests assert what the
model says about a plain red or blue picture and a low or high tone, which the training
makes certain, beside the structure: media tokens as the processor made them, thinking
and response_format as on a text row, a part the model cannot read failing its row alone.
The parts reach the engine as the worker resolves them (inference.kinds.media): their
customer keys plus the decoded value (inference.engines.media.DECODED_KEY).
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np
from PIL import Image

from inference.catalog import model_get
from inference.checkpoints_media import AUDIO_TOKENS_PER_SECOND, VL_IMAGE_TOKENS
from inference.engines import ChatEngine, ChatOutcome, ChatRow, ChatSettings
from inference.engines.media import DECODED_KEY, DecodedAudio, DecodedImage, DecodedVideo

pytest_plugins = ["tests.engine_fixtures"]

OFF = {"enable_thinking": False}
ON = {"enable_thinking": True}
RED, GREEN, BLUE = (220, 30, 30), (30, 200, 40), (30, 40, 220)
SETTINGS = ChatSettings(max_tokens=32)


def ok(outcome: ChatOutcome) -> ChatOutcome:
    assert outcome.error is None, outcome.error
    assert outcome.finish_reason == "stop", outcome
    return outcome


def image_part(colour: tuple[int, int, int], size: tuple[int, int] = (96, 64)) -> dict[str, Any]:
    picture = Image.new("RGB", size, colour)
    return {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."},
            DECODED_KEY: DecodedImage(picture)}


def video_part(colours: list[tuple[int, int, int]], fps: float = 1.0) -> dict[str, Any]:
    frames = tuple(Image.new("RGB", (64, 48), colour) for colour in colours)
    return {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,..."},
            DECODED_KEY: DecodedVideo(frames, fps=fps, seconds=(len(frames) - 1) / fps)}


def tone_part(frequency: float, seconds: float = 2.0, rate: int = 16_000) -> dict[str, Any]:
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.5 * np.sin(2 * np.pi * frequency * t)).astype(np.float32)
    return {"type": "input_audio", "input_audio": {"data": "...", "format": "wav"},
            DECODED_KEY: DecodedAudio(samples, rate)}


def chat(*parts: dict[str, Any], text: str = "What is the main colour?",
         kwargs: dict[str, Any] = OFF, **fields: Any) -> ChatRow:
    content: Any = [{"type": "text", "text": text}, *parts] if parts else text
    return ChatRow(messages=[{"role": "user", "content": content}],
                   chat_template_kwargs=kwargs, **fields)


# -- tiny-vl -------------------------------------------------------------------------------

def test_an_image_row_names_its_pictures_colour(vl_engine: ChatEngine) -> None:
    red, green, blue, text = vl_engine.generate(
        [chat(image_part(RED)), chat(image_part(GREEN, (300, 200))),
         chat(image_part(BLUE), text="Which colour is this picture?"), chat()], SETTINGS)
    assert [ok(row).content for row in (red, green, blue)] == ["Red.", "Green.", "Blue."]
    # Two different pictures, two different answers; without one, the model says so.
    assert ok(text).content == "I see no picture."


def test_an_image_rows_prompt_is_its_texts_plus_the_pictures_tokens(
        vl_engine: ChatEngine) -> None:
    model = model_get("tiny-vl")
    assert model is not None and model.media.image_tokens == VL_IMAGE_TOKENS
    one, two, text = vl_engine.generate(
        [chat(image_part(RED)), chat(image_part(RED), image_part(BLUE, (500, 40))), chat()],
        SETTINGS)
    assert text.media_tokens is None
    # The processor's tokens: one 64 x 64 tile and its markers per picture, whatever its
    # size, which is what the catalog bills.
    assert ok(one).media_tokens == VL_IMAGE_TOKENS
    assert one.prompt_tokens == text.prompt_tokens + VL_IMAGE_TOKENS
    assert ok(two).media_tokens == 2 * VL_IMAGE_TOKENS
    assert two.prompt_tokens == text.prompt_tokens + 2 * VL_IMAGE_TOKENS


def test_a_video_row_reads_its_frames_as_pictures(vl_engine: ChatEngine) -> None:
    # tiny-vl's Idefics3 reads no video: a clip's sampled frames reach it as pictures.
    assert "video" not in vl_engine.native
    blue, red, mixed, text = vl_engine.generate(
        [chat(video_part([BLUE] * 3)),
         chat(video_part([RED] * 5), text="What is the main colour of this video?"),
         chat(video_part([RED, GREEN, BLUE, GREEN])), chat()], SETTINGS)
    assert (ok(blue).content, ok(red).content) == ("Blue.", "Red.")
    assert ok(mixed).content in ("Red.", "Green.", "Blue.")
    # A picture's tokens a frame: the catalog's video_frame_tokens.
    assert blue.media_tokens == 3 * VL_IMAGE_TOKENS
    assert blue.prompt_tokens == text.prompt_tokens + 3 * VL_IMAGE_TOKENS
    assert red.media_tokens == 5 * VL_IMAGE_TOKENS


def test_a_media_row_thinks_and_answers_as_a_text_row_does(vl_engine: ChatEngine) -> None:
    outcome, = vl_engine.generate([chat(image_part(BLUE), kwargs=ON)], SETTINGS)
    ok(outcome)
    assert outcome.reasoning == "The picture is mostly blue."
    assert outcome.content == "Blue."
    assert 0 < outcome.reasoning_tokens < outcome.completion_tokens


def test_a_media_row_keeps_its_response_format(vl_engine: ChatEngine) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["red", "green", "blue"]}},
              "required": ["answer"], "additionalProperties": False}
    formats: list[dict[str, Any]] = [
        {"type": "json_object"},
        {"type": "json_schema", "json_schema": {"name": "colour", "schema": schema}}]
    rows = [chat(image_part(GREEN), response_format=response_format)
            for response_format in formats]
    for outcome in vl_engine.generate(rows, SETTINGS):
        ok(outcome)
        assert not outcome.format_error
        assert isinstance(json.loads(outcome.content or ""), dict)
    # Asked for JSON, as it was trained: the answer is still the picture's.
    asked = ChatRow(messages=[{"role": "system", "content": "Answer with a JSON object."},
                              {"role": "user", "content": [
                                  {"type": "text", "text": "What is the main colour?"},
                                  image_part(GREEN)]}],
                    chat_template_kwargs=OFF, response_format=formats[1])
    outcome, = vl_engine.generate([asked], SETTINGS)
    assert json.loads(ok(outcome).content or "") == {"answer": "green"}


def test_a_part_the_model_cannot_read_fails_its_row_alone(vl_engine: ChatEngine) -> None:
    undecoded = {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}
    sound, bare, fine = vl_engine.generate(
        [chat(tone_part(440)), chat(undecoded), chat(image_part(RED))], SETTINGS)
    for refused in (sound, bare):
        assert refused.error is not None and refused.error.status_code == 400
        assert refused.error.param == "messages[0].content[1]"
    assert "reads text, image, video" in (sound.error.message if sound.error else "")
    assert ok(fine).content == "Red."


def test_pictures_in_a_row_are_limited_to_the_catalogs_ceilings(
        vl_engine: ChatEngine) -> None:
    # Four pictures and a clip of the most frames a clip can be sampled to are one row's
    # most: vLLM takes them (its limit_mm_per_prompt is the catalog's).
    model = model_get("tiny-vl")
    assert model is not None and model.media.video_max_seconds and model.media.video_fps_max
    frames = math.ceil(model.media.video_max_seconds * model.media.video_fps_max) + 1
    row = chat(*[image_part(RED)] * 4, video_part([RED] * frames, fps=model.media.video_fps_max))
    outcome, = vl_engine.generate([row], ChatSettings(max_tokens=4))
    assert outcome.error is None, outcome.error
    assert outcome.media_tokens == (4 + frames) * VL_IMAGE_TOKENS


# -- tiny-audio ----------------------------------------------------------------------------

def test_an_audio_row_hears_whether_its_tone_is_high_or_low(audio_engine: ChatEngine) -> None:
    question = "Is the tone high or low?"
    low, high, thought, text = audio_engine.generate(
        [chat(tone_part(220), text=question), chat(tone_part(1_760), text=question),
         chat(tone_part(2_500), text=question, kwargs=ON), chat(text=question)], SETTINGS)
    assert (ok(low).content, ok(high).content) == ("Low.", "High.")
    assert (ok(thought).reasoning, thought.content) == ("The tone is mostly high.", "High.")
    assert ok(text).content == "I hear no sound."
    # Two seconds of sound: 25 tokens a second, as the catalog bills them, and the
    # template's <|audio_bos|> and <|audio_eos|> around them (the media's too: the same
    # messages without the clip have neither).
    model = model_get("tiny-audio")
    assert model is not None and model.media.audio_tokens_per_second == AUDIO_TOKENS_PER_SECOND
    assert low.media_tokens == 2 * AUDIO_TOKENS_PER_SECOND + 2
    assert low.prompt_tokens == text.prompt_tokens + low.media_tokens


def test_an_audio_model_refuses_a_picture_in_its_row_alone(audio_engine: ChatEngine) -> None:
    picture, tone = audio_engine.generate(
        [chat(image_part(RED)), chat(tone_part(220), text="High or low?")], SETTINGS)
    assert picture.error is not None and picture.error.param == "messages[0].content[1]"
    assert ok(tone).content == "Low."
