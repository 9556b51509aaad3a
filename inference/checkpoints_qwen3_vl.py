"""`tiny-qwen3-vl`: a tiny checkpoint of the Qwen3-VL architecture, the family of the
reference's own VL models (qwen3.8-27b's image and video path, the qwen3-vl-embedding
models), for the GPU check (bench/gpu_media.py, issue 41 item 6). Not served by `make run`:
vLLM's Qwen3-VL module and its processor's video half need torchvision, which has no CPU
build on the registries these machines reach; a CUDA machine has it
(docs/dev/decisions/2026-12-06-media-rows-on-the-vl-embedding-engine.md).

What builds here, without torchvision: the model classes (Qwen3VLConfig,
Qwen3VLForConditionalGeneration, random weights, seeded) and the image processor
(Qwen2VLImageProcessorPil, which Qwen3-VL reads pictures with). The video processor
(Qwen3VLVideoProcessor) refuses to be made without torchvision, so its configuration file
is written as the processor itself saves it, for the GPU machine's transformers to load.

Sizes: a 2-block, 64-wide vision tower (16 px patches, 2 frames a temporal patch, 2x2
merged: a 64 px picture is 4 tokens), one deepstack layer, and a 2-layer, 256-wide text
model with Qwen3-VL's interleaved multimodal rope, on tiny-qwen3's tokenizer plus Qwen's
vision tokens; a few MiB, within what a device call carries (64 MiB in all).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inference.corpus import SEED

VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
PATCH_PIXELS = 16
MERGE = 2
TEMPORAL_PATCH = 2
# Pictures are resized to between 32x32 and 128x128 pixels (4 to 64 merged tokens).
MIN_PIXELS = (PATCH_PIXELS * MERGE) ** 2
MAX_PIXELS = 4 * MIN_PIXELS * 4
MEAN = [0.5, 0.5, 0.5]

VISION_CONFIG: dict[str, Any] = {
    "depth": 2, "hidden_size": 64, "intermediate_size": 128, "num_heads": 2,
    "patch_size": PATCH_PIXELS, "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL_PATCH, "out_hidden_size": 256,
    "num_position_embeddings": 64, "deepstack_visual_indexes": [1],
}
# head_dim 64, and its rope split in three (time, height, width) halves summing to 32.
TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 5_000_000.0,
                        "mrope_section": [8, 12, 12], "mrope_interleaved": True},
}

# tiny-qwen3's chat template with Qwen-VL's media parts in place.
_MEDIA_PART = (
    "{%- if part.type == 'text' -%}{{ part.text }}"
    "{%- elif part.type in ('image', 'image_url') -%}"
    "{{ '" + VISION_START + IMAGE_PAD + VISION_END + "' }}"
    "{%- elif part.type in ('video', 'video_url') -%}"
    "{{ '" + VISION_START + VIDEO_PAD + VISION_END + "' }}"
    "{%- endif -%}"
)


def tiny_qwen3_vl_write(directory: Path, *, tokenizer_from: Path) -> None:
    """Write the checkpoint into `directory`, its tokenizer tiny-qwen3's (`tokenizer_from`,
    a built tiny-qwen3 directory) plus Qwen's vision tokens."""
    import torch
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2VLImageProcessorPil,
        Qwen3VLConfig,
        Qwen3VLForConditionalGeneration,
    )

    from inference.checkpoints import CHAT_TEMPLATE

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_from))
    tokenizer.add_special_tokens({"additional_special_tokens": list(VISION_TOKENS)},
                                 replace_extra_special_tokens=False)
    text_part = "{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}"
    assert text_part in CHAT_TEMPLATE  # the one place media parts go
    template = CHAT_TEMPLATE.replace(text_part, _MEDIA_PART)
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(directory))
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}

    sizes = {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}
    image = Qwen2VLImageProcessorPil(size=sizes, patch_size=PATCH_PIXELS,
                                     temporal_patch_size=TEMPORAL_PATCH, merge_size=MERGE,
                                     image_mean=MEAN, image_std=MEAN)
    image.save_pretrained(str(directory))
    saved = json.loads((directory / "preprocessor_config.json").read_text())
    # Named as Qwen3-VL's own checkpoints name it: the GPU machine picks its processor.
    saved["image_processor_type"] = "Qwen2VLImageProcessor"
    (directory / "preprocessor_config.json").write_text(json.dumps(saved, indent=2))
    (directory / "video_preprocessor_config.json").write_text(json.dumps({
        "video_processor_type": "Qwen3VLVideoProcessor", "processor_class": "Qwen3VLProcessor",
        "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS * 8},
        "patch_size": PATCH_PIXELS, "temporal_patch_size": TEMPORAL_PATCH,
        "merge_size": MERGE, "image_mean": MEAN, "image_std": MEAN, "do_resize": True,
        "do_rescale": True, "do_normalize": True, "do_convert_rgb": True,
        "do_sample_frames": False, "fps": 1, "min_frames": 2, "max_frames": 64,
    }, indent=2))
    (directory / "processor_config.json").write_text(json.dumps(
        {"processor_class": "Qwen3VLProcessor"}, indent=2))
    (directory / "chat_template.jinja").write_text(template)

    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen3VLConfig(
        vision_config=VISION_CONFIG,
        text_config={"vocab_size": len(tokenizer), "pad_token_id": pad, "eos_token_id": eos,
                     "bos_token_id": None, **TEXT_CONFIG},
        image_token_id=ids[IMAGE_PAD], video_token_id=ids[VIDEO_PAD],
        vision_start_token_id=ids[VISION_START], vision_end_token_id=ids[VISION_END],
        tie_word_embeddings=True, dtype="float32")
    config.architectures = ["Qwen3VLForConditionalGeneration"]
    # The seed is the build's own: the caller's random state is put back afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Qwen3VLForConditionalGeneration(config).eval()
    model.save_pretrained(str(directory))
