"""Where a row's media sit in a prompt that an engine writes itself (the VL embedding
engine: inference/engines/embeddings.py), by the checkpoint's model family.

vLLM expands each placeholder into the model's own media tokens from the decoded media it
is given beside the prompt (`multi_modal_data`, in the placeholders' order). A family that
takes video natively has a video placeholder and gets the clip's sampled frames as one
video; one that has none (Idefics3) gets each sampled frame as a picture, in order, each at
its own image placeholder: the frames the product sampled at the job's video_fps, which are
also what the row was billed for
(docs/dev/decisions/2026-12-06-media-rows-on-the-vl-embedding-engine.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Placeholders:
    """image: the text that stands for one picture; video: for one clip, None where the
    family takes a clip as its frames (each an `image`)."""

    image: str
    video: str | None

    @property
    def native_video(self) -> bool:
        return self.video is not None


_QWEN_VL = Placeholders(image="<|vision_start|><|image_pad|><|vision_end|>",
                        video="<|vision_start|><|video_pad|><|vision_end|>")
# config.json's model_type -> its placeholders. Qwen's VL families (the reference's
# qwen3-vl-embedding models) take video natively; Idefics3 (tiny-vl-embedding) does not.
FAMILIES = {
    "idefics3": Placeholders(image="<image>", video=None),
    "qwen2_vl": _QWEN_VL,
    "qwen2_5_vl": _QWEN_VL,
    "qwen3_vl": _QWEN_VL,
}


def placeholders_of(checkpoint: Path) -> Placeholders | None:
    """The checkpoint's placeholders; None for a text-only family (or no config.json)."""
    try:
        config = json.loads((checkpoint / "config.json").read_text())
    except (OSError, ValueError):
        return None
    return FAMILIES.get(str(config.get("model_type")))
