"""Content parts on chat rows: encoders, part shapes, formats and their order, inline bytes
against the declared format, inline size caps, clip durations (declared, read, estimated,
assumed), video frames at the sampling rate, and the HEAD probe."""

from __future__ import annotations

import json
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

import pytest

from tests.unit.test_validation_media_files import (
    ADTS,
    AVI,
    JPEG,
    MP3_FRAME,
    WMA,
    b64,
    data_uri,
    flac_bytes,
    mp4_bytes,
    png_bytes,
    wav_bytes,
    webm_bytes,
)
from tests.unit.test_validation_support import chat_line, check, refusal

AUDIO_FORMATS = "wav, mp3, m4a, aac, ogg, opus, flac, aiff"
VIDEO_FORMATS = "mp4, webm, mov, mkv, avi"
IMAGE_FORMATS = "png, jpeg, webp, gif, bmp, tiff"


def part(kind: str, **media: object) -> dict[str, object]:
    return {"type": kind, kind: media}


def row(*parts: Mapping[str, object], custom_id: str = "a") -> dict[str, object]:
    return chat_line(custom_id, [{"type": "text", "text": "look"}, *parts])


@pytest.mark.parametrize("media", [
    part("input_audio", data=b64(wav_bytes(1)), format="wav"),
    part("audio_url", url="https://e.com/a.mp3"),
])
def test_a_part_the_model_has_no_encoder_for_names_model_and_modality(
        media: dict[str, object]) -> None:
    assert refusal("qwen3.8-27b", [row(media)]) == (
        "Row 'a': model 'qwen3.8-27b' has no encoder for audio input (it takes text, image "
        "and video); choose a model that takes audio")


@pytest.mark.parametrize("media,expected", [
    ({"type": "image_url", "image_url": "https://e.com/a.png"},
     "Row 'a': a content part of type image_url carries its media in an object under "
     "'image_url'"),
    (part("image_url"), "Row 'a': image_url.url must be an https:// URL or a data: URI"),
    (part("video_url", url="http://e.com/a.mp4"),
     "Row 'a': video_url.url must be an https:// URL or a data: URI, not 'http:...' (media "
     "is fetched over HTTPS only)"),
    (part("audio_url", url="s3://bucket/a.mp3"),
     "Row 'a': audio_url.url must be an https:// URL or a data: URI, not 's3:...' (media is "
     "fetched over HTTPS only)"),
    (part("image_url", url="data:image/png,rawbytes"),
     "Row 'a': image_url.url is a data: URI without base64 data (data:<media "
     "type>;base64,<data>)"),
    (part("image_url", url="data:image/png;base64,not*base64!"),
     "Row 'a': the inline data in image_url is not valid base64"),
    (part("input_audio", data=b64(wav_bytes(1))),
     f"Row 'a': input_audio.format is required: one of {AUDIO_FORMATS}"),
    (part("input_audio", format="wav"),
     "Row 'a': input_audio.data must carry the audio's bytes as base64"),
    (part("input_audio", data=data_uri("audio/wav", wav_bytes(1)), format="wav"),
     "Row 'a': input_audio.data is bare base64 without a data: prefix (or send the data: URI "
     "as an audio_url)"),
    (part("audio_url", url="https://e.com/a.mp3", duration_seconds=-1),
     "Row 'a': audio_url.duration_seconds must be a positive number of seconds"),
    (part("video_url", url="https://e.com/a.mp4", duration_seconds="45"),
     "Row 'a': video_url.duration_seconds must be a positive number of seconds"),
    (part("input_audio", data=b64(wav_bytes(1)), format="wav", duration_seconds=True),
     "Row 'a': input_audio.duration_seconds must be a positive number of seconds"),
])
def test_part_shapes(media: dict[str, object], expected: str) -> None:
    assert refusal("gemma4-12b", [row(media)]) == expected


@pytest.mark.parametrize("media,expected", [
    (part("audio_url", url="https://e.com/a.wma"),
     f"Row 'a': audio format 'wma' is not supported: supported audio formats are "
     f"{AUDIO_FORMATS}"),
    (part("input_audio", data=b64(WMA), format="WMA"),
     f"Row 'a': audio format 'wma' is not supported: supported audio formats are "
     f"{AUDIO_FORMATS}"),
    (part("audio_url", url=data_uri("audio/x-ms-wma", WMA)),
     f"Row 'a': audio format 'wma' is not supported: supported audio formats are "
     f"{AUDIO_FORMATS}"),
    (part("audio_url", url=data_uri("application/octet-stream", WMA)),
     f"Row 'a': audio format 'wma' is not supported: supported audio formats are "
     f"{AUDIO_FORMATS}"),
    (part("video_url", url="https://e.com/clip.flv"),
     f"Row 'a': video format 'flv' is not supported: supported video formats are "
     f"{VIDEO_FORMATS}"),
    (part("image_url", url="https://e.com/p.heic"),
     f"Row 'a': image format 'heic' is not supported: supported image formats are "
     f"{IMAGE_FORMATS}"),
    (part("image_url", url=data_uri("image/svg+xml", b"<svg/>")),
     f"Row 'a': image format 'svg' is not supported: supported image formats are "
     f"{IMAGE_FORMATS}"),
    (part("image_url", url=data_uri("image/x-foo", png_bytes())),
     f"Row 'a': image format 'image/x-foo' is not supported: supported image formats are "
     f"{IMAGE_FORMATS}"),
    (part("image_url", url=data_uri("audio/wav", wav_bytes(1))),
     "Row 'a': image_url carries audio (wav); send audio as an audio_url part"),
    (part("video_url", url="https://e.com/song.mp3"),
     "Row 'a': video_url carries audio (mp3); send audio as an audio_url part"),
    (part("image_url", url=data_uri("", b"plain text, no magic")),
     f"Row 'a': the inline image in image_url is not in a format we recognise: supported "
     f"image formats are {IMAGE_FORMATS}"),
])
def test_formats_off_the_allowlist_are_refused_naming_the_line(media: dict[str, object],
                                                              expected: str) -> None:
    assert refusal("gemma4-12b", [row(media)]) == expected


@pytest.mark.parametrize("media,expected", [
    (part("input_audio", data=b64(flac_bytes(1)), format="wav"),
     "Row 'a': the inline audio in input_audio is flac, but input_audio.format says wav"),
    (part("video_url", url=data_uri("video/mp4", webm_bytes(3))),
     "Row 'a': the inline video in video_url is webm, but its data: media type 'video/mp4' "
     "says mp4"),
    (part("image_url", url=data_uri("image/png", JPEG)),
     "Row 'a': the inline image in image_url is jpeg, but its data: media type 'image/png' "
     "says png"),
    (part("audio_url", url=data_uri("audio/mpeg", wav_bytes(1))),
     "Row 'a': the inline audio in audio_url is wav, but its data: media type 'audio/mpeg' "
     "says mp3"),
])
def test_inline_bytes_that_contradict_the_declared_format_are_refused(
        media: dict[str, object], expected: str) -> None:
    assert refusal("gemma4-12b", [row(media)]) == expected


@pytest.mark.parametrize("media", [
    part("audio_url", url=data_uri("audio/mp4", mp4_bytes(2, brand=b"M4A "))),
    part("audio_url", url=data_uri("audio/x-m4a", mp4_bytes(2))),      # the same container
    part("video_url", url=data_uri("video/x-matroska", webm_bytes(2))),
    part("audio_url", url="https://e.com/voice.mp4", duration_seconds=3),  # mp4 audio: m4a
    part("image_url", url=data_uri("image/png", b"unrecognised bytes")),  # no contradiction
    part("input_audio", data=b64(MP3_FRAME), format="mp3", duration_seconds=1),
    part("image_url", url="https://e.com/photo"),  # extensionless image: passed through
    part("image_url", url=data_uri("application/octet-stream", png_bytes())),  # sniffed
])
def test_formats_that_pass(media: dict[str, object]) -> None:
    assert check("gemma4-12b", [row(media)]).rows == 1


@pytest.mark.parametrize("kind,megabytes,noun", [
    ("image_url", 20, "image"), ("audio_url", 25, "audio file"), ("video_url", 50, "video file"),
])
def test_inline_media_over_its_cap_is_refused(kind: str, megabytes: int, noun: str) -> None:
    over = b"A" * ((megabytes * 1024 * 1024 + 3) * 4 // 3)
    media = {"type": kind, kind: {"url": "data:application/octet-stream;base64,OVER"}}
    # The line as json.dumps writes it, without its scan of the 27 to 67 MB of payload.
    line = json.dumps(row(media)).encode().replace(b"OVER", over)
    assert refusal("gemma4-12b", [line]) == \
        f"Row 'a': an embedded {noun} exceeds the size limit (max {megabytes} MB)"


@pytest.mark.parametrize("model_id,media,job,expected", [
    ("gemma4-12b", part("input_audio", data=b64(wav_bytes(45)), format="wav"), {},
     "Row 'a': audio duration 45s exceeds the 30s maximum for model 'gemma4-12b'. Shorten or "
     "split this audio input."),
    ("gemma4-12b", part("input_audio", data=b64(ADTS + bytes(93_001 - 4)), format="aac"), {},
     "Row 'a': audio duration estimated at 32s from its size exceeds the 30s maximum for "
     "model 'gemma4-12b'. Declare duration_seconds if the clip is shorter, or shorten or "
     "split this audio input."),
    ("gemma4-12b", part("video_url", url="https://e.com/a.mp4", duration_seconds=60.5), {},
     "Row 'a': video duration 60.5s exceeds the 60s maximum for model 'gemma4-12b'. Shorten "
     "or split this video input."),
    ("nemotron-3-nano-omni-30b", part("video_url", url="https://e.com/a.mp4",
                                      duration_seconds=300), {},
     "Row 'a': video is 300 s; at the default 2 fps the longest clip nemotron-3-nano-omni-30b "
     "takes is 255 s. Shorten the clip or lower video_fps."),
    ("qwen3.8-27b", part("video_url", url=data_uri("video/quicktime",
                                                   mp4_bytes(70, brand=b"qt  ", fps=12))),
     {"video_fps": 20},
     "Row 'a': video is 70 s; at the clip's own 12 fps the longest clip qwen3.8-27b takes "
     "is 64 s. Shorten the clip or lower video_fps."),
    ("qwen3.8-27b", part("video_url", url=data_uri("video/avi", AVI + bytes(2_560_000 - 16))),
     {"video_fps": 20},
     "Row 'a': video is 40 s (estimated from its size); at the requested 20 fps the longest "
     "clip qwen3.8-27b takes is 38 s. Shorten the clip or lower video_fps."),
    ("gemma4-12b", part("video_url", url=data_uri("video/x-msvideo", AVI + bytes(3_904_000))),
     {},
     "Row 'a': video duration estimated at 62s from its size exceeds the 60s maximum for "
     "model 'gemma4-12b'. Declare duration_seconds if the clip is shorter, or shorten or "
     "split this video input."),
])
def test_clip_lengths_against_the_models_caps(model_id: str, media: dict[str, object],
                                              job: dict[str, Any], expected: str) -> None:
    assert refusal(model_id, [row(media)], **job) == expected


def test_a_declared_length_wins_over_the_clips_own_header() -> None:
    media = part("input_audio", data=b64(wav_bytes(45)), format="wav", duration_seconds=20)
    report = check("gemma4-12b", [row(media)])
    assert report.usage.media_seconds == 20 and report.usage.media_tokens == 500


@pytest.mark.parametrize("model_id,media,job,seconds,tokens,estimated", [
    # read from the header: WebM at the default 2 fps -> ceil(90.5) + 1 = 92 frames x 64
    ("nemotron-3-nano-omni-30b", part("video_url", url=data_uri("video/webm",
                                                                webm_bytes(45.25, fps=25))),
     {}, "45.25", 92 * 64, 0),
    # an MP4 shot at 2 fps is sampled at 2 even when the job asks for 20
    ("qwen3.8-27b", part("video_url", url=data_uri("video/mp4", mp4_bytes(45, fps=2))),
     {"video_fps": 20}, "45", 91 * 168, 0),
    ("qwen3.8-27b", part("video_url", url=data_uri("video/mp4", mp4_bytes(45))),
     {"video_fps": 0.5}, "45", 24 * 168, 0),
    ("gemma4-12b", part("input_audio", data=b64(flac_bytes(12)), format="flac"), {},
     "12", 300, 0),
    # untyped inline bytes: the format and then the length come from the bytes themselves
    ("gemma4-12b", part("audio_url", url=data_uri("application/octet-stream",
                                                  wav_bytes(4))), {}, "4", 100, 0),
    # estimated from bytes: an AVI at 512 kbit/s, 640,000 bytes -> 10 s, 21 frames at 2 fps
    ("nemotron-3-nano-omni-30b", part("video_url", url=data_uri("video/avi",
                                                                AVI + bytes(640_000 - 16))),
     {}, "10", 21 * 64, 1),
    # hosted and undeclared: the model's ceiling, 40 minutes on nemotron
    ("nemotron-3-nano-omni-30b", part("audio_url", url="https://e.com/a.mp3"), {},
     "2400", 30_000, 1),
    ("gemma4-12b", part("audio_url", url="https://e.com/a.ogg"), {}, "30", 750, 1),
    # ...and for video on a model with no clip ceiling, the longest clip at the rate
    ("qwen3.8-27b", part("video_url", url="https://e.com/a.mp4"), {"video_fps": 20},
     "38.95", 780 * 168, 1),
    ("gemma4-12b", part("video_url", url="https://e.com/a.webm"), {}, "60", 61 * 256, 1),
    # a clip holds at least 2 frames
    ("qwen3.8-27b", part("video_url", url="https://e.com/a.mp4", duration_seconds=0.2), {},
     "0.2", 2 * 168, 0),
])
def test_clip_seconds_and_tokens(model_id: str, media: dict[str, object],
                                 job: dict[str, Any], seconds: str, tokens: int,
                                 estimated: int) -> None:
    report = check(model_id, [row(media)], **job)
    assert report.usage.media_seconds == Decimal(seconds)
    assert report.usage.media_tokens == tokens
    assert report.usage.clips == 1
    assert report.estimated_clips == estimated


class Probe:
    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def __call__(self, url: str) -> str | None:
        self.asked.append(url)
        return self.answer


@pytest.mark.parametrize("kind,answer,expected", [
    ("audio_url", "application/octet-stream",
     f"Row 'a': the host of https://e.com/clip answers Content-Type "
     f"'application/octet-stream', which is not a supported audio format ({AUDIO_FORMATS}). "
     "Put a file extension on the URL, serve the object with its real content type, or send "
     "the bytes inline."),
    ("audio_url", "audio/x-ms-wma",
     f"Row 'a': the host of https://e.com/clip answers Content-Type 'audio/x-ms-wma', which "
     f"is not a supported audio format ({AUDIO_FORMATS}). Put a file extension on the URL, "
     "serve the object with its real content type, or send the bytes inline."),
    ("video_url", "audio/mpeg",
     f"Row 'a': the host of https://e.com/clip answers Content-Type 'audio/mpeg', which is "
     f"not a supported video format ({VIDEO_FORMATS}). Put a file extension on the URL, "
     "serve the object with its real content type, or send the bytes inline."),
])
def test_an_extensionless_clip_url_is_refused_on_a_bad_content_type(
        kind: str, answer: str, expected: str) -> None:
    media = {"type": kind, kind: {"url": "https://e.com/clip"}}
    assert refusal("gemma4-12b", [row(media)], probe=Probe(answer)) == expected


@pytest.mark.parametrize("answer", [None, "audio/mpeg", "audio/mp4; codecs=mp4a"])
def test_a_host_that_does_not_answer_or_names_a_good_type_is_admitted(
        answer: str | None) -> None:
    probe = Probe(answer)
    report = check("gemma4-12b", [row(part("audio_url", url="https://e.com/clip"))],
                   probe=probe)
    assert probe.asked == ["https://e.com/clip"] and report.probed_urls == 1


def test_only_the_first_32_extensionless_clip_urls_are_probed_each_once() -> None:
    probe = Probe(None)
    rows = [row(part("audio_url", url=f"https://e.com/clip-{n % 40}"), custom_id=f"r{n}")
            for n in range(80)]
    report = check("gemma4-12b", rows, probe=probe)
    assert len(probe.asked) == 32 == len(set(probe.asked)) == report.probed_urls


def test_images_urls_with_extensions_and_inline_media_are_never_probed() -> None:
    probe = Probe("application/octet-stream")
    rows = [row(part("image_url", url="https://e.com/photo")),
            row(part("audio_url", url="https://e.com/a.mp3?x=1"), custom_id="b"),
            row(part("input_audio", data=b64(wav_bytes(1)), format="wav"), custom_id="c"),
            row(part("video_url", url=data_uri("video/mp4", mp4_bytes(1))), custom_id="d")]
    assert check("gemma4-12b", rows, probe=probe).rows == 4
    assert probe.asked == []
