"""Issue 41, item 1: the worker's own decoders (inference/kinds/media_decode.py), on media
made here: each format the reference lists decodes to what an engine takes, bounded, and
bytes that are not such media are refused in words a customer can act on."""

from __future__ import annotations

import io
import struct
import wave
import zlib

import numpy as np
import pytest
from PIL import Image

from inference.engines.media import DecodedAudio, DecodedImage, DecodedVideo
from inference.kinds.media_decode import (
    FRAME_MAX_PIXELS,
    MAX_IMAGE_PIXELS,
    DecoderMissing,
    Undecodable,
    audio_decode,
    decoded_bytes,
    image_decode,
    video_decode,
)
from tests.media import clip, dominant, noise_picture, picture, rgb, tone

RED, GREEN, BLUE = (255, 0, 0), (0, 160, 0), (0, 0, 255)


def loudest(audio: DecodedAudio) -> float:
    """The frequency (Hz) that carries most of a clip's energy."""
    spectrum = np.abs(np.fft.rfft(audio.samples))
    return float(np.argmax(spectrum)) * audio.rate / len(audio.samples)


def png_header(width: int, height: int) -> bytes:
    """A PNG that declares its size and holds (almost) nothing: a decompression bomb's
    header."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(
            ">I", zlib.crc32(kind + data))
    return (b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


# -- pictures -------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF", "BMP", "TIFF"])
def test_every_image_format_the_reference_lists_decodes_to_rgb_at_its_size(fmt: str) -> None:
    decoded = image_decode(picture(BLUE, size=(40, 30), fmt=fmt))
    assert isinstance(decoded, DecodedImage)
    assert (decoded.image.mode, decoded.image.size) == ("RGB", (40, 30))
    red, green, blue = rgb(decoded.image, (20, 15))
    assert blue >= 240 and red <= 12 and green <= 12


def test_a_transparent_picture_is_laid_on_white() -> None:
    out = io.BytesIO()
    Image.new("RGBA", (8, 8), (0, 0, 255, 0)).save(out, "PNG")
    assert image_decode(out.getvalue()).image.getpixel((0, 0)) == (255, 255, 255)


def test_an_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (16, 16), colour) for colour in (RED, BLUE)]
    out = io.BytesIO()
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    red, _green, blue = rgb(image_decode(out.getvalue()).image, (8, 8))
    assert red > 200 and blue < 50


@pytest.mark.parametrize("data,reason", [
    (b"hello, not a picture", "the bytes are not an image in a supported format (png, "
                              "jpeg, webp, gif, bmp, tiff)"),
    # A format Pillow reads but the reference does not list is never offered to it (an EPS
    # would run Ghostscript; an ICO is plain off the list).
    (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "the bytes are not an image"),
])
def test_bytes_that_are_no_listed_picture_are_refused(data: bytes, reason: str) -> None:
    with pytest.raises(Undecodable) as refused:
        image_decode(data)
    assert str(refused.value).startswith(reason)


def test_an_icon_is_refused_though_pillow_reads_it() -> None:
    out = io.BytesIO()
    Image.new("RGB", (16, 16), RED).save(out, "ICO")
    with pytest.raises(Undecodable, match="not an image in a supported format"):
        image_decode(out.getvalue())


def test_a_truncated_picture_is_refused() -> None:
    whole = noise_picture(3, size=(256, 192), fmt="PNG")
    with pytest.raises(Undecodable, match="damaged or truncated"):
        image_decode(whole[:len(whole) // 2])


def test_a_decompression_bomb_is_refused_from_its_header_before_any_pixel() -> None:
    # 7,000 x 7,000 (49 Mpx) is over our 40 Mpx, under Pillow's own limit: ours refuses it
    with pytest.raises(Undecodable) as ours:
        image_decode(png_header(7_000, 7_000))
    assert str(ours.value) == (f"the image is 7,000 x 7,000 pixels, over the "
                               f"{MAX_IMAGE_PIXELS:,}-pixel limit; send a smaller picture")
    # 20,000 x 20,000 trips Pillow's own check inside open(), before the header is ours
    with pytest.raises(Undecodable, match="declares more than 40,000,000 pixels"):
        image_decode(png_header(20_000, 20_000))


# -- sound ----------------------------------------------------------------------------------

def test_a_wav_is_mono_float32_at_the_models_rate_its_tone_kept() -> None:
    decoded = audio_decode(tone(440, seconds=2, rate=44_100, channels=2), rate=16_000,
                           max_seconds=30)
    assert (decoded.rate, decoded.samples.dtype, decoded.samples.shape) == (
        16_000, np.float32, (32_000,))
    assert abs(loudest(decoded) - 440) < 1
    assert 0.45 < float(np.abs(decoded.samples).max()) <= 0.51


def test_resampling_down_does_not_fold_the_highs_into_what_the_model_hears() -> None:
    # A 12 kHz tone cannot be heard at 16 kHz (Nyquist 8 kHz): a plain interpolation would
    # fold it to 4 kHz at full strength; the band-limited resampler drops it.
    decoded = audio_decode(tone(12_000, seconds=1, rate=44_100), rate=16_000, max_seconds=30)
    middle = decoded.samples[2_000:-2_000]
    assert float(np.sqrt(np.mean(middle ** 2))) < 0.01


def test_a_clip_is_read_no_further_than_its_billed_seconds() -> None:
    decoded = audio_decode(tone(220, seconds=5, rate=16_000), rate=16_000, max_seconds=1.5)
    assert decoded.samples.shape == (24_000,)


@pytest.mark.parametrize("width", [1, 3, 4])
def test_8_24_and_32_bit_wavs_decode(width: int) -> None:
    rate = 8_000
    wave_values = np.sin(2 * np.pi * 500 * np.arange(rate) / rate) * 0.5
    if width == 1:
        raw = ((wave_values + 1.0) * 127.5).astype(np.uint8).tobytes()
    else:
        ints = (wave_values * (2 ** (8 * width - 1) - 1)).astype("<i4")
        # 24-bit: the low three bytes of each 32-bit value, little-endian
        raw = ints.tobytes() if width == 4 else b"".join(
            value.to_bytes(4, "little", signed=True)[:3] for value in ints.tolist())
    out = io.BytesIO()
    with wave.open(out, "wb") as clip_file:
        clip_file.setnchannels(1)
        clip_file.setsampwidth(width)
        clip_file.setframerate(rate)
        clip_file.writeframes(raw)
    decoded = audio_decode(out.getvalue(), rate=16_000, max_seconds=30)
    assert abs(loudest(decoded) - 500) < 2
    assert 0.4 < float(np.abs(decoded.samples[1_000:-1_000]).max()) < 0.6


def test_other_audio_containers_need_pyav() -> None:
    # A float WAV is no PCM the standard library reads: PyAV's, like mp3 or flac.
    samples = (np.sin(2 * np.pi * 300 * np.arange(16_000) / 16_000) * 0.5).astype("<f4")
    header = struct.pack("<4sI4s4sIHHIIHH4sI", b"RIFF", 36 + samples.nbytes, b"WAVE",
                         b"fmt ", 16, 3, 1, 16_000, 64_000, 4, 32, b"data", samples.nbytes)
    data = header + samples.tobytes()
    try:
        import av  # noqa: F401
    except ImportError:
        with pytest.raises(DecoderMissing):
            audio_decode(data, rate=16_000, max_seconds=30)
        return
    decoded = audio_decode(data, rate=16_000, max_seconds=30)
    assert abs(loudest(decoded) - 300) < 2


def test_a_damaged_pcm_wav_is_refused() -> None:
    whole = tone(440, seconds=1)
    broken = whole[:22] + b"\x00\x00" + whole[24:]  # no channels
    with pytest.raises(Undecodable, match="the WAV file is damaged"):
        audio_decode(broken, rate=16_000, max_seconds=30)


# -- video ----------------------------------------------------------------------------------

def test_frames_are_sampled_as_the_reference_bills_them_with_the_clips_last() -> None:
    # 2.5 s at 10 fps (its last frame at 2.4 s): red, then blue, then green
    video = clip([RED] * 10 + [BLUE] * 10 + [GREEN] * 5, fps=10)
    decoded = video_decode(video, fps=1.0, max_seconds=60, max_frames=100)
    assert isinstance(decoded, DecodedVideo)
    # t = 0, 1, 2, and the last frame: ceil(2.4 x 1) + 1 = 4
    assert (len(decoded.frames), decoded.fps) == (4, 1.0)
    assert abs(decoded.seconds - 2.4) < 1e-6
    assert [dominant(frame) for frame in decoded.frames] == [0, 2, 1, 1]
    assert all(frame.mode == "RGB" and frame.size == (64, 48) for frame in decoded.frames)


def test_a_rate_above_the_clips_own_gives_its_own_frames_once_each() -> None:
    decoded = video_decode(clip([RED] * 10, fps=5), fps=20.0, max_seconds=60, max_frames=500)
    assert (len(decoded.frames), decoded.fps) == (10, 5.0)


def test_a_clip_is_read_no_further_than_its_billed_seconds_and_frames() -> None:
    video = clip([RED] * 50, fps=10)  # 5 s
    assert len(video_decode(video, fps=2.0, max_seconds=1.0, max_frames=100).frames) == 3
    assert len(video_decode(video, fps=10.0, max_seconds=60, max_frames=7).frames) == 7


def test_large_frames_are_shrunk_to_the_frame_budget() -> None:
    decoded = video_decode(clip([BLUE] * 2, fps=1, size=(1920, 1080)), fps=1.0,
                           max_seconds=60, max_frames=10)
    frame = decoded.frames[0]
    assert frame.width * frame.height <= FRAME_MAX_PIXELS
    assert abs(frame.width / frame.height - 1920 / 1080) < 0.01


@pytest.mark.parametrize("data", [b"\x00\x00\x00\x18ftypmp42" + b"x" * 200, b"",
                                  clip([RED] * 10, fps=10)[:300]])
def test_bytes_that_are_no_video_are_refused(data: bytes) -> None:
    with pytest.raises(Undecodable, match="video"):
        video_decode(data, fps=1.0, max_seconds=60, max_frames=10)


def test_decoded_bytes_is_what_the_values_hold() -> None:
    assert decoded_bytes(image_decode(picture(RED, size=(10, 20)))) == 600
    audio = audio_decode(tone(100, seconds=1, rate=16_000), rate=16_000, max_seconds=9)
    assert decoded_bytes(audio) == 64_000
    video = video_decode(clip([RED] * 3, fps=1), fps=1.0, max_seconds=9, max_frames=9)
    assert decoded_bytes(video) == 3 * 64 * 48 * 3
