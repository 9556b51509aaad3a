"""`tiny-vl-embedding`: the embedded default's VL embedding checkpoint (issue 41 item 5),
built by `manage.py build_checkpoints` beside tiny-qwen3, nothing downloaded.

An Idefics3 model (the family whose vLLM module imports without torchvision, on the CPU
machines here: docs/dev/decisions/2026-12-06-media-rows-on-the-vl-embedding-engine.md): a
2-layer, 64-wide vision tower reading one 64 px tile in 16 px patches, its pixel-shuffle
connector (scale 2: 4 image tokens a picture), and a 2-layer, 256-wide Llama text model, on
tiny-qwen3's own tokenizer plus Idefics3's image tokens. It is served by vLLM's pooling
runner (the generative architecture converted to an embedding model, pooled at the last
token as its sentence-transformers files declare), so a text row, an image row and a video
row (its sampled frames, each an image) come out of one model in one space, 256 wide.

The weights are random, seeded: an embedding of random weights already depends on every
pixel and every token it reads (two pictures give two vectors), which is all the local
model has to show; nothing is trained, so it builds in a few seconds.

The text tokens reuse tiny-qwen3's tokenizer (its special tokens included) from its built
directory, so this checkpoint is built after it and rebuilt when its recipe changes
(RECIPE in inference.checkpoints carries both).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from inference.corpus import SEED

# Idefics3's own image tokens, each one added (special) token: vLLM's Idefics3 processor
# replaces each <image> of a prompt by <fake_token_around_image><global-img>, the image's
# tokens, <fake_token_around_image>.
IMAGE_TOKEN = "<image>"  # noqa: S105 (a placeholder, not a secret)
IMAGE_TOKENS = (IMAGE_TOKEN, "<fake_token_around_image>", "<global-img>",
                "<end_of_utterance>")
IMAGE_PIXELS = 64  # one tile, the whole picture resized to it (no splitting)
PATCH_PIXELS = 16
SCALE_FACTOR = 2
# What one picture takes in a prompt: its (64/16)^2 / 2^2 = 4 image tokens and the three
# tokens around them. The catalog's image_tokens and video_frame_tokens for
# tiny-vl-embedding are this number, so what a row bills is what the engine reads.
IMAGE_SEQ_LEN = (IMAGE_PIXELS // PATCH_PIXELS) ** 2 // SCALE_FACTOR ** 2
IMAGE_PROMPT_TOKENS = IMAGE_SEQ_LEN + 3

VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 2, "image_size": IMAGE_PIXELS, "patch_size": PATCH_PIXELS,
}
# head_dim 64: vLLM's CPU attention takes 32/64/80/..., not 16 (as tiny-qwen3's).
TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
}
# sentence-transformers' description of the pooling, which vLLM reads from the checkpoint:
# the last token's state (the position a Qwen-style embedding model pools).
MODULES = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
           {"idx": 1, "name": "1", "path": "1_Pooling",
            "type": "sentence_transformers.models.Pooling"}]


def tiny_vl_embedding_write(directory: Path, *, tokenizer_from: Path) -> None:
    """Write the checkpoint into `directory`, its tokenizer tiny-qwen3's (`tokenizer_from`,
    a built tiny-qwen3 directory) plus the image tokens."""
    import torch
    from transformers import (
        Idefics3Config,
        Idefics3ForConditionalGeneration,
        Idefics3ImageProcessorPil,
        Idefics3Processor,
        PreTrainedTokenizerFast,
    )

    tokenizer = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_from))
    tokenizer.add_special_tokens({"additional_special_tokens": list(IMAGE_TOKENS)},
                                 replace_extra_special_tokens=False)
    image_processor = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": IMAGE_PIXELS},
        max_image_size={"longest_edge": IMAGE_PIXELS})
    processor = Idefics3Processor(image_processor=image_processor, tokenizer=tokenizer,
                                  image_seq_len=IMAGE_SEQ_LEN)
    processor.save_pretrained(str(directory))

    pad = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Idefics3Config(
        vision_config=VISION_CONFIG,
        text_config={"model_type": "llama", "vocab_size": len(tokenizer),
                     "pad_token_id": pad, "eos_token_id": eos, "bos_token_id": None,
                     **TEXT_CONFIG},
        image_token_id=tokenizer.convert_tokens_to_ids(IMAGE_TOKEN),
        scale_factor=SCALE_FACTOR, pad_token_id=pad, tie_word_embeddings=True,
        dtype="float32")
    config.architectures = ["Idefics3ForConditionalGeneration"]
    # The seed is the build's own: the caller's random state is put back afterwards.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        model = Idefics3ForConditionalGeneration(config).eval()
    model.save_pretrained(str(directory))

    (directory / "modules.json").write_text(json.dumps(MODULES, indent=2))
    (directory / "1_Pooling").mkdir()
    (directory / "1_Pooling" / "config.json").write_text(json.dumps({
        "word_embedding_dimension": TEXT_CONFIG["hidden_size"],
        "pooling_mode_lasttoken": True, "pooling_mode_mean_tokens": False,
        "pooling_mode_cls_token": False, "include_prompt": True}, indent=2))

