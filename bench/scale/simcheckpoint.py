"""The tokenizer the scale harness's estimates count with (benchmark code, never part of the
product).

The estimator counts every row with the served model's tokenizer (ANEX_CHECKPOINTS), and the
simulated GPU workers load no weights, so the harness needs a tokenizer and a chat template
only. It uses the real tiny-qwen3 checkpoint when one is given (--checkpoint, e.g. the
coordinator's shared build); otherwise it builds a SIMULATION checkpoint: a byte-level BPE
tokenizer trained in seconds by the product's own recipe (inference.checkpoints) on a few
hundred generated conversations, with tiny-qwen3's chat template, and no weights.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

MARK = "SIMULATION-CHECKPOINT.txt"


def simulated_checkpoint(directory: Path) -> Path:
    """A tokenizer-only checkpoint under `directory` (built once)."""
    if (directory / MARK).exists():
        return directory
    from inference.checkpoints import CHAT_TEMPLATE, _tokenizer_train
    from inference.corpus import SEED, conversation_generate

    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(SEED)  # noqa: S311 (reproducible text, not a secret)
    tokenizer = _tokenizer_train([conversation_generate(rng) for _ in range(300)])
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "chat_template": CHAT_TEMPLATE, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "model_max_length": 32768}))
    (directory / MARK).write_text(
        "A simulation checkpoint for bench/scale: a tokenizer and chat template, no weights.\n")
    return directory
