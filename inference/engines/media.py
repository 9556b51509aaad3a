"""Media as the engines take it: decoded by the product, never fetched by vLLM (issue 41).

The worker brings each media part's bytes through the one SSRF-safe fetcher (anex.net) and
decodes them itself before a row reaches an engine; an engine reads only what is here, and
never the part's URL or data URI. A media part of a row handed to an engine (a ChatRow's
message content part, an embedding row's content part) keeps the keys the customer sent and
gains one more, DECODED_KEY, holding one of the values below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

# The key a resolved media part carries its decoded value under.
DECODED_KEY = "anex_decoded"


@dataclass(frozen=True, slots=True)
class DecodedImage:
    """One picture, RGB, at the size it was sent (the model's processor resizes it)."""

    image: Image.Image


@dataclass(frozen=True, slots=True)
class DecodedAudio:
    """One clip's sound: mono float32 samples in [-1, 1] at `rate` Hz (the model's own
    rate), as long as the clip billed."""

    samples: np.ndarray
    rate: int


@dataclass(frozen=True, slots=True)
class DecodedVideo:
    """One clip's frames, RGB, sampled at `fps` (the job's video_fps, or the model's
    default) from its start, up to the clip ceiling; `seconds` is the clip's length."""

    frames: tuple[Image.Image, ...]
    fps: float
    seconds: float


Decoded = DecodedImage | DecodedAudio | DecodedVideo
