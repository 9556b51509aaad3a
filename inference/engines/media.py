"""Media as the engines take it: decoded by the product, never fetched by vLLM (issue 41).

The worker brings each media part's bytes through the one SSRF-safe fetcher (anex.net) and
decodes them itself before a row reaches an engine; an engine reads only what is here, and
never the part's URL or data URI. A media part of a row handed to an engine (a ChatRow's
message content part, an embedding row's content part) keeps the keys the customer sent and
gains one more, DECODED_KEY, holding one of the values below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    from PIL import Image

    from inference.catalog import CatalogModel

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


@dataclass(frozen=True, slots=True)
class MediaLimits:
    """The most media one row brings a model's engine (vLLM's limit_mm_per_prompt is made
    of these): the per-row caps (inference.rows.core.INLINE_ITEMS_PER_ROW) for the
    modalities the catalog says the model takes, and the most frames one clip of it is
    sampled to (video_frames_max)."""

    images: int = 0
    audios: int = 0
    videos: int = 0
    frames: int = 0

    @classmethod
    def of(cls, model: CatalogModel) -> MediaLimits | None:
        """The model's limits; None for a model that takes text only."""
        from inference.rows.core import INLINE_ITEMS_PER_ROW

        taken = set(model.media_modalities)
        if not taken:
            return None
        return cls(images=INLINE_ITEMS_PER_ROW["image"] if "image" in taken else 0,
                   audios=INLINE_ITEMS_PER_ROW["audio"] if "audio" in taken else 0,
                   videos=INLINE_ITEMS_PER_ROW["video"] if "video" in taken else 0,
                   frames=video_frames_max(model) if "video" in taken else 0)

    def per_prompt(self, *, native_video: bool) -> dict[str, int]:
        """vLLM's limit_mm_per_prompt: a model whose engine takes no video reads a clip's
        frames as pictures, so its pictures are the row's and every clip's frames."""
        limits = {"image": self.images, "audio": self.audios}
        if native_video:
            limits["video"] = self.videos
        else:
            limits["image"] += self.videos * self.frames
        return {modality: most for modality, most in limits.items() if most}


def video_frames_max(model: CatalogModel) -> int:
    """The most frames a clip on this model is sampled to, as it is billed: one at each
    1/rate seconds of a clip as long as the model's ceiling, plus the last, at the highest
    rate a job may set; a model with no duration ceiling takes clips as long as their
    frames fit its context."""
    media = model.media
    if media.video_max_seconds:
        rate = media.video_fps_max or media.video_fps_default or 1
        return math.ceil(media.video_max_seconds * rate) + 1
    context = model.media_context_tokens or model.context_tokens
    return max(context // (media.video_frame_tokens or context), 1)
