"""Media made here for tests (nothing downloaded): pictures, tones and short clips, as bytes
or data: URIs, each simple enough that its decoded values can be asserted (a picture's
one colour, a tone's frequency, a clip's frames)."""

from __future__ import annotations

import base64
import io
import tempfile
import wave
from pathlib import Path
from typing import cast

import numpy as np
from PIL import Image


def picture(colour: tuple[int, int, int], *, size: tuple[int, int] = (64, 48),
            fmt: str = "PNG") -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, colour).save(out, fmt)
    return out.getvalue()


def noise_picture(seed: int, *, size: tuple[int, int] = (1024, 768), fmt: str = "JPEG") -> bytes:
    """A picture unlike any other seed's, that compresses as a photo does."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1] // 8, size[0] // 8, 3),
                                                  dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).resize(size, Image.Resampling.BILINEAR).save(out, fmt, quality=85)
    return out.getvalue()


def tone(frequency: float, *, seconds: float = 1.0, rate: int = 44_100,
         channels: int = 1) -> bytes:
    """A sine at half scale as 16-bit PCM WAV."""
    t = np.arange(int(seconds * rate)) / rate
    samples = (np.sin(2 * np.pi * frequency * t) * 0.5 * 32767).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as clip:
        clip.setnchannels(channels)
        clip.setsampwidth(2)
        clip.setframerate(rate)
        clip.writeframes(np.repeat(samples, channels).tobytes())
    return out.getvalue()


def clip(colours: list[tuple[int, int, int]], *, fps: int = 10,
         size: tuple[int, int] = (64, 48)) -> bytes:
    """An MP4 (MPEG-4 Part 2) of one frame per colour at `fps`, made with OpenCV."""
    import cv2

    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "clip.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, size)
        for red, green, blue in colours:
            frame = np.zeros((size[1], size[0], 3), np.uint8)
            frame[:] = (blue, green, red)
            writer.write(frame)
        writer.release()
        return path.read_bytes()


def rgb(image: Image.Image, at: tuple[int, int] = (0, 0)) -> tuple[int, int, int]:
    """A pixel of an RGB picture."""
    red, green, blue = cast(tuple[int, int, int], image.getpixel(at))
    return red, green, blue


def dominant(image: Image.Image) -> int:
    """Which of red (0), green (1) or blue (2) a picture's corner is mostly."""
    pixel = rgb(image)
    return max(range(3), key=pixel.__getitem__)


def data_uri(data: bytes, media_type: str) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"
