"""The embedded default's local media checkpoints (issue 41): `tiny-vl` (text, images and
video) and `tiny-audio` (text and audio), built by `manage.py build_checkpoints` beside
tiny-qwen3 (inference.checkpoints registers them), nothing downloaded.

Both are built on tiny-qwen3's tokenizer with the media tokens their architecture reads
added as special tokens, and its chat template with media parts rendered in place (a
message's `{"type": "image"}` / `{"type": "audio"}` parts, as transformers' multimodal
templates take them). Both are architectures vLLM serves on a CPU without torchvision
(docs/dev/decisions/2026-12-06-media-checkpoints-and-frames-as-images.md):
- `tiny-vl`: Idefics3 (the SmolVLM family), a 2-layer SigLIP-style vision tower reading a
  64 x 64 picture in 16 patches, shuffled into IMAGE_SEQ_LEN tokens, and a 2-layer Llama.
  Trained on generated pictures, and runs of frames, each mostly red, green or blue, to
  name the main colour. Its processor does not split pictures into tiles: a picture is
  always VL_IMAGE_TOKENS tokens. vLLM's Idefics3 takes no video: the chat engine hands it a
  clip's sampled frames as pictures (inference.engines.chat).
- `tiny-audio`: Qwen2-Audio, a 2-layer Whisper-style encoder over 128 mel bins and a
  2-layer Qwen2, AUDIO_TOKENS_PER_SECOND tokens a second of sound. Trained on generated
  tones to say whether one is high or low. vLLM runs Qwen2-Audio's encoder over Whisper's
  whole 30-second window (3,000 mel frames, padding masked out of its attention), which
  would make training cost six times what the tones need: it is trained on a window of
  AUDIO_WINDOW_SECONDS, then given the full window's positions (the ones past it never
  trained, zero). A clip within the trained window reads exactly as it did in training
  (every position past its end is masked from every real one, and the convolutions see
  the same padding), so the catalog holds tiny-audio's clips to that window
  (audio_max_seconds).

Each is trained for a few hundred steps (seeded, on a fixed number of steps) on generated
conversations rendered through its own template, thinking on and off as tiny-qwen3's are,
so that what it answers depends on the media: a red picture is "Red.", a blue one "Blue.";
a 220 Hz tone "Low.", a 1,760 Hz one "High."; a row without media gets a sentence saying
so; asked for JSON, it answers an object.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.corpus import SEED

TINY_VL = "tiny-vl"
TINY_AUDIO = "tiny-audio"
# The served model id each media checkpoint backs (ANEX_CHECKPOINTS).
MEDIA_SERVED_BY = {"tiny-vl": TINY_VL, "tiny-audio": TINY_AUDIO}
# Bump when what a build writes changes.
MEDIA_RECIPE = {TINY_VL: 2, TINY_AUDIO: 4}

# The Idefics3 tokens (its processor's names) and Qwen2-Audio's.
VL_TOKENS = ("<fake_token_around_image>", "<image>", "<end_of_utterance>", "<global-img>")
AUDIO_TOKENS = ("<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>")
IMAGE_PLACEHOLDER = "<image>"
AUDIO_PLACEHOLDER = "<|audio_bos|><|AUDIO|><|audio_eos|>"

# tiny-vl: a picture is resized to IMAGE_SIZE square, read in (IMAGE_SIZE / PATCH)^2
# patches, shuffled by SCALE_FACTOR into IMAGE_SEQ_LEN tokens; with the two
# <fake_token_around_image> and the <global-img> around them, VL_IMAGE_TOKENS in all.
IMAGE_SIZE = 64
PATCH = 16
SCALE_FACTOR = 2
IMAGE_SEQ_LEN = (IMAGE_SIZE // PATCH) ** 2 // SCALE_FACTOR ** 2
VL_IMAGE_TOKENS = IMAGE_SEQ_LEN + 3
# tiny-audio: 16 kHz sound in 10 ms mel frames, halved by the encoder's strided
# convolution and again by its pooling: 25 tokens a second.
AUDIO_RATE = 16_000
AUDIO_HOP = 160
AUDIO_WINDOW_SECONDS = 5
AUDIO_TOKENS_PER_SECOND = AUDIO_RATE // AUDIO_HOP // 4
WHISPER_WINDOW_SECONDS = 30  # what vLLM's Qwen2-Audio reads, whatever the clip

# head_dim 64: vLLM's CPU attention takes 32/64/80/..., not 16.
TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 384,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": IMAGE_SIZE,
    "patch_size": PATCH,
}
AUDIO_CONFIG: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 128,
    "d_model": 64,
    "max_source_positions": AUDIO_WINDOW_SECONDS * AUDIO_RATE // AUDIO_HOP // 2,
}
# Qwen2-Audio's lm_head is its own (transformers ties none of its weights), so vLLM must
# not tie it either.
AUDIO_TEXT_CONFIG: dict[str, Any] = {**TEXT_CONFIG, "tie_word_embeddings": False}

# The training runs: so many batches of TRAIN_BATCH conversations each, over a pool of
# generated media (each picture processed once, each tone's features extracted once).
VL_STEPS = 200
AUDIO_STEPS = 200
ENCODER_STEPS = 60  # tiny-audio's encoder alone, before the whole model
TRAIN_BATCH = 16
TRAIN_LR = 3e-3
PICTURES = 240
TONES = 160

COLOURS = {"red": (220, 30, 30), "green": (30, 200, 40), "blue": (30, 40, 220)}
LOW_HZ, HIGH_HZ = (110.0, 400.0), (1_000.0, 3_500.0)

# tiny-qwen3's chat template with media parts rendered in place: a thinking model that
# opens its trace itself, reasoning_effort read into the system turn (checkpoints.py says
# why), and a content part {"type": "image"} or {"type": "audio"} printed as the
# architecture's placeholder. A part of any other type prints nothing.
MEDIA_CHAT_TEMPLATE = """\
{%- set thinking = true -%}
{%- if enable_thinking is defined and enable_thinking is not none -%}
{%- set thinking = enable_thinking -%}
{%- endif -%}
{%- set effort = reasoning_effort if reasoning_effort is defined and reasoning_effort else '' -%}
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}
{%- for part in content -%}
{%- if part.type == 'text' -%}{{ part.text }}
{%- elif part.type == 'image' -%}@IMAGE@
{%- elif part.type == 'audio' -%}@AUDIO@
{%- endif -%}
{%- endfor -%}
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


def media_chat_template(*, image: str = "", audio: str = "") -> str:
    return MEDIA_CHAT_TEMPLATE.replace("@IMAGE@", image).replace("@AUDIO@", audio)


def media_builders(dest: Path) -> dict[str, Callable[[Path], None]]:
    """The media checkpoints' builders, by name. Each reads tiny-qwen3's tokenizer from
    `dest`, which checkpoints_build writes first."""
    base = dest / "tiny-qwen3"
    return {TINY_VL: lambda directory: tiny_vl_write(directory, base=base),
            TINY_AUDIO: lambda directory: tiny_audio_write(directory, base=base)}


# -- what both are trained on --------------------------------------------------------------

_QUESTIONS = {
    "image": ("What is the main colour?", "Which colour is this picture?",
              "Name the main colour.", "What colour fills the image?",
              "Describe the colour of this.", "What colour do you see?"),
    "video": ("What is the main colour of this video?", "Which colour fills the clip?",
              "What colour do you see?", "What is the main colour?"),
    "audio": ("Is the tone high or low?", "High or low?", "Is this sound high or low?",
              "Describe the pitch.", "What do you hear?"),
}
_NO_MEDIA = {"image": "I see no picture.", "video": "I see no picture.",
             "audio": "I hear no sound."}
_JSON_SYSTEM = "Answer with a JSON object."
_SYSTEMS = ("You are a helpful assistant.", "Answer briefly.", "You describe media.")


@dataclass(frozen=True)
class _Example:
    """A conversation about `media` (indices into the run's pool, in the order their
    placeholders appear), and the answer the model learns."""

    messages: list[dict[str, Any]]
    kwargs: dict[str, Any]
    completion: str
    media: tuple[int, ...] = ()


def _example(rng: random.Random, modality: str, media: tuple[int, ...], label: str | None,
             noun: str) -> _Example:
    """One conversation: a question with its media parts (before or after it), thinking
    on or off, now and then a system turn or a request for JSON."""
    question = rng.choice(_QUESTIONS[modality])
    parts: list[dict[str, Any]] = [{"type": "image" if modality != "audio" else "audio"}
                                   for _ in media]
    text = {"type": "text", "text": question}
    content: Any = question if not parts else \
        ([*parts, text] if rng.random() < 0.5 else [text, *parts])
    messages: list[dict[str, Any]] = []
    json_answer = rng.random() < 0.15
    if json_answer:
        messages.append({"role": "system", "content": _JSON_SYSTEM})
    elif rng.random() < 0.2:
        messages.append({"role": "system", "content": rng.choice(_SYSTEMS)})
    messages.append({"role": "user", "content": content})
    thinking = rng.random() < 0.5
    if label is None:
        answer, thought = _NO_MEDIA[modality], "There is nothing to look at or listen to."
        if json_answer:
            answer = _compact({"answer": None})
    else:
        answer, thought = f"{label.capitalize()}.", f"The {noun} is mostly {label}."
        if json_answer:
            answer = _compact({"answer": label})
    completion = f"{thought}\n</think>\n\n{answer}<|im_end|>" if thinking \
        else f"{answer}<|im_end|>"
    return _Example(messages, {"enable_thinking": thinking}, completion, media)


def _compact(value: object) -> str:
    """JSON as the engine's grammar writes it (no whitespace: inference/engines/runtime.py),
    so a constrained answer follows the path the model learnt."""
    return json.dumps(value, separators=(",", ":"))


# -- the tokenizer -------------------------------------------------------------------------

def _media_tokenizer(base: Path, tokens: Sequence[str], template: str) -> Any:
    """tiny-qwen3's tokenizer with `tokens` added as special tokens (each one token, never
    made from a message's text: inference.tokens), and the media template."""
    from tokenizers import AddedToken, Tokenizer
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer.from_file(str(base / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken(token, normalized=False, special=True)
                                  for token in tokens])
    config = json.loads((base / "tokenizer_config.json").read_text())
    special = [token for token in config.get("additional_special_tokens") or
               config.get("extra_special_tokens") or [] if isinstance(token, str)]
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, additional_special_tokens=[*special, *tokens],
        model_max_length=32768, **{"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})
    wrapped.chat_template = template
    return wrapped


def _tokenized(example: _Example, tokenizer: Any, expand: Callable[[list[int]], list[int]]
               ) -> tuple[list[int], int]:
    """The prompt as the engine renders it, its placeholders expanded as vLLM expands
    them, then the completion; and where the learnt part starts."""
    prompt = tokenizer.apply_chat_template(example.messages, tokenize=False,
                                           add_generation_prompt=True, **example.kwargs)
    ids = expand(tokenizer.encode(str(prompt), add_special_tokens=False))
    start = len(ids)
    return ids + tokenizer.encode(example.completion, add_special_tokens=False), start


# -- training ------------------------------------------------------------------------------

@dataclass
class _Run:
    """One training run: the model, how it embeds a batch's media (their features, in the
    order their tokens appear), which token they replace, and its examples."""

    model: Any
    text_model: Any
    lm_head: Any
    media_token: int
    features: Callable[[list[int]], Any]  # pool indices -> (tokens, hidden) tensor
    steps: int
    examples: list[tuple[list[int], int, tuple[int, ...]]] = field(default_factory=list)
    # A loss on the media features alone, added to the answer's (and the parameters it
    # trains, dropped after training): what the encoder must tell apart, said directly.
    auxiliary: Callable[[Any, list[int]], Any] | None = None
    auxiliary_parameters: list[Any] = field(default_factory=list)


def _fit(run: _Run, *, pad: int) -> None:
    import torch

    model = run.model
    model.train()
    optimizer = torch.optim.AdamW([*model.parameters(), *run.auxiliary_parameters],
                                  lr=TRAIN_LR, betas=(0.9, 0.98), weight_decay=0.01)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: _learning_rate_factor(step, run.steps))
    rng = random.Random(SEED)  # noqa: S311 (a reproducible order)
    embed = run.text_model.get_input_embeddings()
    for _ in range(run.steps):
        batch = rng.sample(run.examples, TRAIN_BATCH)
        tokens = torch.full((len(batch), max(len(ids) for ids, _, _ in batch)), pad)
        learnt = torch.zeros(tokens.shape, dtype=torch.bool)
        for row, (ids, start, _media) in enumerate(batch):
            tokens[row, :len(ids)] = torch.tensor(ids)
            learnt[row, start:len(ids)] = True
        embeds = embed(tokens)
        media = [index for _, _, items in batch for index in items]
        features = None
        if media:
            features = run.features(media)
            slots = (tokens == run.media_token).unsqueeze(-1)
            embeds = embeds.masked_scatter(slots, features.to(embeds.dtype))
        # Right-padded: a causal model never attends forward, so no attention mask.
        hidden = run.text_model(inputs_embeds=embeds).last_hidden_state
        targets = learnt[:, 1:]
        logits = run.lm_head(hidden[:, :-1][targets])
        loss = torch.nn.functional.cross_entropy(logits, tokens[:, 1:][targets])
        if run.auxiliary is not None and features is not None:
            loss = loss + run.auxiliary(features, media)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    model.eval()


def _learning_rate_factor(step: int, steps: int) -> float:
    """A linear warm-up over the first 5% of the steps, then a cosine down to a tenth."""
    warmup = max(1, steps // 20)
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))


def _seeded(build: Callable[[], Any]) -> Any:
    """`build()` on every core the process may use, under the build's own seed (the
    caller's random state and thread count are put back)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(SEED)
            return build()
    finally:
        torch.set_num_threads(threads)


# -- tiny-vl -------------------------------------------------------------------------------

def picture_generate(rng: random.Random, colour: str) -> Any:  # a PIL image
    """A picture mostly of `colour` (its shade varied), at a random size and aspect, with a
    smaller block of another colour somewhere on it."""
    from PIL import Image, ImageDraw

    width, height = rng.randint(24, 200), rng.randint(24, 200)

    def shade(name: str) -> tuple[int, int, int]:
        base = COLOURS[name]
        return (*[min(255, max(0, value + rng.randint(-30, 30))) for value in base],)  # type: ignore[return-value]

    picture = Image.new("RGB", (width, height), shade(colour))
    other = rng.choice([name for name in COLOURS if name != colour])
    block_w, block_h = rng.randint(1, width // 3 + 1), rng.randint(1, height // 3 + 1)
    left, top = rng.randint(0, width - block_w), rng.randint(0, height - block_h)
    ImageDraw.Draw(picture).rectangle((left, top, left + block_w - 1, top + block_h - 1),
                                      fill=shade(other))
    return picture


def _vl_processor(tokenizer: Any) -> Any:
    from transformers import Idefics3ImageProcessorPil, Idefics3Processor

    images = Idefics3ImageProcessorPil(
        do_image_splitting=False, size={"longest_edge": IMAGE_SIZE},
        max_image_size={"longest_edge": IMAGE_SIZE}, image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5])
    return Idefics3Processor(image_processor=images, tokenizer=tokenizer,
                             image_seq_len=IMAGE_SEQ_LEN, chat_template=tokenizer.chat_template)


def tiny_vl_write(directory: Path, *, base: Path) -> None:
    from transformers import GenerationConfig, Idefics3Config

    tokenizer = _media_tokenizer(base, VL_TOKENS, media_chat_template(image=IMAGE_PLACEHOLDER))
    processor = _vl_processor(tokenizer)
    ids = {token: tokenizer.convert_tokens_to_ids(token)
           for token in (*VL_TOKENS, "<|im_end|>", "<|endoftext|>")}
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    config = Idefics3Config(
        text_config={"model_type": "llama", "vocab_size": len(tokenizer), **TEXT_CONFIG,
                     "pad_token_id": ids["<|endoftext|>"], "bos_token_id": None,
                     "eos_token_id": eos},
        vision_config=VISION_CONFIG, scale_factor=SCALE_FACTOR,
        image_token_id=ids["<image>"], pad_token_id=ids["<|endoftext|>"],
        tie_word_embeddings=True, dtype="float32")
    config.architectures = ["Idefics3ForConditionalGeneration"]
    expansion = [ids["<fake_token_around_image>"], ids["<global-img>"],
                 *[ids["<image>"]] * IMAGE_SEQ_LEN, ids["<fake_token_around_image>"]]

    def expand(prompt: list[int]) -> list[int]:
        out: list[int] = []
        for token in prompt:
            out += expansion if token == ids["<image>"] else [token]
        return out

    model = _seeded(lambda: _tiny_vl_train(config, processor, expand))
    model.save_pretrained(directory)
    processor.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"],
                     do_sample=False).save_pretrained(directory)


def _tiny_vl_train(config: Any, processor: Any, expand: Callable[[list[int]], list[int]]
                   ) -> Any:
    import torch
    from transformers import Idefics3ForConditionalGeneration

    rng = random.Random(SEED)  # noqa: S311 (reproducible media, not a secret)
    names = list(COLOURS)
    labels = [names[i % len(names)] for i in range(PICTURES)]
    pictures = [picture_generate(rng, label) for label in labels]
    pixels = torch.as_tensor(processor.image_processor(pictures, return_tensors="np")
                             ["pixel_values"]).reshape(PICTURES, 3, IMAGE_SIZE, IMAGE_SIZE)
    model = Idefics3ForConditionalGeneration(config)
    inner = model.model

    def features(indices: list[int]) -> Any:
        hidden = inner.vision_model(pixel_values=pixels[indices]).last_hidden_state
        return inner.connector(hidden).reshape(-1, config.text_config.hidden_size)

    run = _Run(model=model, text_model=inner.text_model, lm_head=model.lm_head,
               media_token=int(config.image_token_id), features=features, steps=VL_STEPS)
    tokenizer = processor.tokenizer
    for _ in range(VL_STEPS * TRAIN_BATCH // 4):
        draw = rng.random()
        if draw < 0.6:  # a picture
            index = rng.randrange(PICTURES)
            example = _example(rng, "image", (index,), labels[index], "picture")
        elif draw < 0.9:  # a clip's frames, most of them of one colour
            main = rng.choice(names)
            frames = rng.randint(2, 5)
            chosen = [rng.choice([i for i in range(PICTURES) if labels[i] == main])
                      for _ in range(frames // 2 + 1)]
            chosen += [rng.randrange(PICTURES) for _ in range(frames - len(chosen))]
            rng.shuffle(chosen)
            chosen_labels = [labels[i] for i in chosen]
            label = max(names, key=chosen_labels.count)
            example = _example(rng, "video", tuple(chosen), label, "video")
        else:
            example = _example(rng, rng.choice(("image", "video")), (), None, "picture")
        ids, start = _tokenized(example, tokenizer, expand)
        run.examples.append((ids, start, example.media))
    _fit(run, pad=int(config.pad_token_id))
    return model


# -- tiny-audio ----------------------------------------------------------------------------

def tone_generate(rng: random.Random, high: bool) -> Any:  # float32 samples at AUDIO_RATE
    """A sine (now and then with a harmonic; some noise, or none), high or low, for half a
    second to four, at a random loudness."""
    import numpy as np

    low_hz, high_hz = HIGH_HZ if high else LOW_HZ
    frequency = math.exp(rng.uniform(math.log(low_hz), math.log(high_hz)))
    seconds = rng.uniform(0.5, 4.0)
    t = np.arange(int(seconds * AUDIO_RATE)) / AUDIO_RATE
    wave = np.sin(2 * np.pi * frequency * t)
    if rng.random() < 0.3:
        wave += 0.3 * np.sin(4 * np.pi * frequency * t)
    # A quarter of the tones clean: a pure tone's silent mel bins sit at the log floor,
    # far from a noisy one's, and a model that never heard one answers it by chance.
    spread = 0.0 if rng.random() < 0.25 else rng.uniform(0, 0.05)
    noise = np.random.default_rng(rng.randrange(2**32)).normal(0, spread, len(t))
    return (rng.uniform(0.1, 0.8) * wave / np.abs(wave).max() + noise).astype(np.float32)


def _audio_processor(tokenizer: Any, seconds: int) -> Any:
    """The processor reading `seconds` of sound: the trained window, or Whisper's."""
    from transformers import Qwen2AudioProcessor, WhisperFeatureExtractor

    extractor = WhisperFeatureExtractor(feature_size=AUDIO_CONFIG["num_mel_bins"],
                                        sampling_rate=AUDIO_RATE, hop_length=AUDIO_HOP,
                                        chunk_length=seconds)
    return Qwen2AudioProcessor(feature_extractor=extractor, tokenizer=tokenizer,
                               chat_template=tokenizer.chat_template)


def tiny_audio_write(directory: Path, *, base: Path) -> None:
    from transformers import GenerationConfig, Qwen2AudioConfig

    tokenizer = _media_tokenizer(base, AUDIO_TOKENS, media_chat_template(audio=AUDIO_PLACEHOLDER))
    processor = _audio_processor(tokenizer, AUDIO_WINDOW_SECONDS)
    ids = {token: tokenizer.convert_tokens_to_ids(token)
           for token in (*AUDIO_TOKENS, "<|im_end|>", "<|endoftext|>")}
    eos = [ids["<|im_end|>"], ids["<|endoftext|>"]]
    config = Qwen2AudioConfig(
        audio_config=AUDIO_CONFIG,
        text_config={"model_type": "qwen2", "vocab_size": len(tokenizer), **AUDIO_TEXT_CONFIG,
                     "pad_token_id": ids["<|endoftext|>"], "bos_token_id": None,
                     "eos_token_id": eos},
        audio_token_index=ids["<|AUDIO|>"], dtype="float32")
    config.architectures = ["Qwen2AudioForConditionalGeneration"]
    model, = _seeded(lambda: (_tiny_audio_train(config, processor, ids["<|AUDIO|>"]),))
    _whisper_window(model)
    model.save_pretrained(directory)
    _vllm_weight_names(directory)
    _audio_processor(tokenizer, WHISPER_WINDOW_SECONDS).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    GenerationConfig(eos_token_id=eos, pad_token_id=ids["<|endoftext|>"],
                     do_sample=False).save_pretrained(directory)


def _whisper_window(model: Any) -> None:
    """The trained encoder given Whisper's whole window of positions, those past the
    trained window zero (its clips never reach them unmasked)."""
    import torch

    tower = model.model.audio_tower
    trained = tower.embed_positions.weight.detach()
    positions = WHISPER_WINDOW_SECONDS * AUDIO_RATE // AUDIO_HOP // 2
    table = torch.nn.Embedding(positions, trained.shape[1])
    with torch.no_grad():
        table.weight.zero_()
        table.weight[:len(trained)] = trained
    tower.embed_positions = table
    tower.max_source_positions = positions
    tower.config.max_source_positions = positions
    model.config.audio_config.max_source_positions = positions


def _tiny_audio_train(config: Any, processor: Any, audio_token: int) -> Any:
    import torch
    from transformers import Qwen2AudioForConditionalGeneration

    rng = random.Random(SEED)  # noqa: S311 (reproducible media, not a secret)
    highs = [i % 2 == 0 for i in range(TONES)]
    tones = [tone_generate(rng, high) for high in highs]
    extracted = processor.feature_extractor(
        tones, sampling_rate=AUDIO_RATE, return_attention_mask=True, padding="max_length",
        truncation=True, return_tensors="pt")
    mels, lengths = extracted["input_features"], extracted["attention_mask"].sum(-1)
    model = Qwen2AudioForConditionalGeneration(config)
    inner = model.model
    tower = inner.audio_tower

    def features(indices: list[int]) -> Any:
        # As vLLM runs the encoder: the padded frames masked out of attention, each clip's
        # tokens cut at its length.
        cut, out_lengths = tower._get_feat_extract_output_lengths(lengths[indices])
        positions = mels.shape[-1] // 2
        padded = torch.arange(positions)[None, :] >= cut[:, None]
        mask = torch.zeros(len(indices), 1, positions, positions)
        mask.masked_fill_(padded[:, None, None, :], float("-inf"))
        hidden = tower(mels[indices], attention_mask=mask).last_hidden_state
        projected = inner.multi_modal_projector(hidden)
        return torch.cat([projected[i, :int(n)] for i, n in enumerate(out_lengths)])

    counts = [int(n) for n in tower._get_feat_extract_output_lengths(lengths)[1]]
    # The pitch said from each clip's mean feature: the encoder learns to tell high from
    # low in the first steps, and the text model to read it from there.
    pitch = torch.nn.Linear(config.text_config.hidden_size, 2)
    labels = torch.tensor([int(high) for high in highs])

    def auxiliary(features: Any, indices: list[int]) -> Any:
        clips = torch.split(features, [counts[index] for index in indices])
        means = torch.stack([clip.mean(0) for clip in clips])
        return torch.nn.functional.cross_entropy(pitch(means), labels[indices])

    # First the encoder alone, until it tells high from low: a text model trained beside an
    # encoder that tells nothing learns to ignore it, and answers one pitch for every tone.
    encoder = [*tower.parameters(), *inner.multi_modal_projector.parameters(),
               *pitch.parameters()]
    optimizer = torch.optim.AdamW(encoder, lr=TRAIN_LR / 2)
    for _ in range(ENCODER_STEPS):
        chosen = rng.sample(range(TONES), TRAIN_BATCH)
        auxiliary(features(chosen), chosen).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    run = _Run(model=model, text_model=inner.language_model, lm_head=model.lm_head,
               media_token=audio_token, features=features, steps=AUDIO_STEPS,
               auxiliary=auxiliary, auxiliary_parameters=list(pitch.parameters()))
    tokenizer = processor.tokenizer

    def expander(index: int | None) -> Callable[[list[int]], list[int]]:
        def expand(prompt: list[int]) -> list[int]:
            out: list[int] = []
            for token in prompt:
                out += [audio_token] * counts[index] if token == audio_token \
                    and index is not None else [token]
            return out
        return expand

    for _ in range(AUDIO_STEPS * TRAIN_BATCH // 4):
        if rng.random() < 0.9:
            index = rng.randrange(TONES)
            label = "high" if highs[index] else "low"
            example = _example(rng, "audio", (index,), label, "tone")
            ids, start = _tokenized(example, tokenizer, expander(index))
        else:
            example = _example(rng, "audio", (), None, "tone")
            ids, start = _tokenized(example, tokenizer, expander(None))
        run.examples.append((ids, start, example.media))
    _fit(run, pad=int(config.text_config.pad_token_id))
    return model


def _vllm_weight_names(directory: Path) -> None:
    """transformers 5.19 saves Qwen2-Audio's text model under `language_model.model.model.`,
    where vLLM 0.32 reads the published Qwen2-Audio's layout, `language_model.model.`
    (it refuses the file otherwise): renamed in the safetensors file."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    saved, published = "language_model.model.model.", "language_model.model."
    tensors = {published + name[len(saved):] if name.startswith(saved) else name: tensor
               for name, tensor in load_file(str(path)).items()}
    save_file(tensors, str(path), metadata={"format": "pt"})
