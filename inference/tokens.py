"""Exact token counts with each model's own tokenizer (the checkpoint's tokenizer.json), and
a chat row's prompt as the engine renders it (the checkpoint's own chat template).

Which checkpoint serves a model id is deployment configuration (ANEX_CHECKPOINTS). A model
with no configured checkpoint cannot be counted, so a job on it cannot be priced
automatically: the estimator fails it with the reference's reason.

    tokens = token_counter("tiny-qwen3")      # ModelTokens, or None
    tokens("some text")                       # one string's count
    tokens.count_batch(texts)                 # many, in one call into the Rust tokenizer
    tokens.chat_prompt(messages, kwargs)      # the prompt text the chat engine serves

The chat engine renders every row through ChatTemplate.render and encodes it with the same
tokenizer (inference.engines.chat), so the estimate's count of a text row and the served
prompt_tokens are one computation and cannot drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from tokenizers import Tokenizer

TokenCounter = Callable[[str], int]

# The special tokens a template sees by name, as transformers' apply_chat_template passes
# them (its special_tokens_map).
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                   "cls_token", "mask_token")
# Arguments of the rendering itself: a row's chat_template_kwargs never stands in for one.
RENDERING_ARGUMENTS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "messages",
})


class ChatTemplate:
    """A checkpoint's chat template, compiled once (transformers' own sandboxed Jinja
    environment, as apply_chat_template compiles it)."""

    def __init__(self, source: str, special_tokens: dict[str, str]) -> None:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        self._template = _compile_jinja_template(source)
        self._special = special_tokens

    @classmethod
    def of_checkpoint(cls, checkpoint: Path) -> ChatTemplate | None:
        """The checkpoint's template (chat_template.jinja, else tokenizer_config.json's
        chat_template); None when it has none."""
        config_path = checkpoint / "tokenizer_config.json"
        config: dict[str, Any] = json.loads(config_path.read_text()) \
            if config_path.is_file() else {}
        source_path = checkpoint / "chat_template.jinja"
        source = source_path.read_text() if source_path.is_file() \
            else config.get("chat_template")
        if not isinstance(source, str):
            return None
        special = {name: _token_text(config.get(name)) for name in _SPECIAL_TOKENS}
        return cls(source, {name: text for name, text in special.items() if text is not None})

    def render(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str:
        """The prompt text of these messages under a row's template kwargs, ready for the
        assistant's turn. Raises whatever the template raises for messages it refuses."""
        own = {key: value for key, value in kwargs.items()
               if key.isidentifier() and key not in RENDERING_ARGUMENTS}
        return str(self._template.render(messages=messages, tools=None, documents=None,
                                         add_generation_prompt=True,
                                         **{**self._special, **own}))


def _token_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


class ModelTokens:
    """A model's tokenizer (and chat template, where its checkpoint has one). Called with a
    string it counts that string (a CountTokens)."""

    def __init__(self, tokenizer: Tokenizer, template: ChatTemplate | None) -> None:
        self.tokenizer = tokenizer
        self.template = template

    def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids, no special tokens added (the prompt carries its own)."""
        return [encoding.ids for encoding in
                self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def encode_batch_marked(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's token ids with the tokenizer's own markers (MiniLM: [CLS] ... [SEP])."""
        return [encoding.ids for encoding in
                self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=True)]

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Each text's count, in one call (the Rust tokenizer's batch, no offsets kept)."""
        return [len(encoding) for encoding in
                self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def chat_prompt(self, messages: list[dict[str, Any]], kwargs: dict[str, Any]) -> str | None:
        """The prompt text the chat engine serves for these messages; None without a
        template."""
        if self.template is None:
            return None
        return self.template.render(messages, kwargs)


@cache
def checkpoint_tokens(checkpoint: Path) -> ModelTokens | None:
    """A checkpoint's tokenizer and template, loaded once per process."""
    path = checkpoint / "tokenizer.json"
    if not path.is_file():
        return None
    tokenizer = Tokenizer.from_file(str(path))
    # A tokenizer.json may carry its training's padding and truncation (MiniLM's: both at
    # 128), which would count every text as 128 tokens and cut a long one short.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return ModelTokens(tokenizer, ChatTemplate.of_checkpoint(checkpoint))


def token_counter(model_id: str) -> ModelTokens | None:
    checkpoint = settings.ANEX_CHECKPOINTS.get(model_id)
    if checkpoint is None:
        return None
    return checkpoint_tokens(Path(checkpoint).resolve())
