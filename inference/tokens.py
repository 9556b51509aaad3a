"""Exact token counts with each model's own tokenizer (the checkpoint's tokenizer.json), and
a chat row's prompt as the engine renders it (the checkpoint's own chat template,
inference.chat_template).

Which checkpoint serves a model id is deployment configuration (ANEX_CHECKPOINTS). A model
with no configured checkpoint cannot be counted, so a job on it cannot be priced
automatically: the estimator fails it with the reference's reason.

    tokens = token_counter("tiny-qwen3")      # ModelTokens, or None
    tokens("some text")                       # one string's count
    tokens.count_batch(texts)                 # many, in one call into the Rust tokenizer
    tokens.counting()                         # one file's counter: repeated pieces once
    tokens.chat_prompt(messages, kwargs)      # the prompt text the chat engine serves

The chat engine renders every row through ChatTemplate.render and encodes it with the same
tokenizer (inference.engines.chat), so the estimate's count of a text row and the served
prompt_tokens are one computation and cannot drift.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from django.conf import settings
from tokenizers import Tokenizer

from inference.chat_template import ChatTemplate
from inference.token_pieces import PieceCounts


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

    def prompt_counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens as an embedding engine reads it (inference.engines.embeddings):
        with the tokenizer's own markers, or, where it adds none, one end-of-text token
        appended. What a realtime embedding request is counted and billed by, before any
        engine sees it."""
        marked = [len(ids) for ids in self.encode_batch_marked(texts)]
        return [count + 1 for count in marked] if self._adds_no_markers else marked

    @cached_property
    def _adds_no_markers(self) -> bool:
        return self.encode_batch_marked(["x"]) == self.encode_batch(["x"])

    def count_batch(self, texts: Sequence[str]) -> list[int]:
        """Each text's count, in one call (the Rust tokenizer's batch, no offsets kept)."""
        return [len(encoding) for encoding in
                self.tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)]

    def counting(self) -> PieceCounts | None:
        """A counter for one file's texts that tokenizes each repeated piece (a shared
        system prompt, the template's role headers) once (inference.token_pieces); None
        where this tokenizer's counts cannot be taken piecewise exactly."""
        split = self._splitter
        return PieceCounts(self.tokenizer, split) if split is not None else None

    @cached_property
    def _splitter(self) -> Callable[[str], list[str]] | None:
        return PieceCounts.splitter(self.tokenizer)

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


def uncounted(text: str) -> int:
    """The count of a text that is not tokenized here: none, a lower bound. Where a model
    has no tokenizer (an estimate, a preflight check) a row is then refused only for a rule
    it breaks whatever its text counts to (its shape, a media cap, media alone over the
    context), never for a count that could not be made; where the engine's own count is
    billed (a served row's media, a realtime request) the text is not counted twice."""
    return 0


def token_counter(model_id: str) -> ModelTokens | None:
    checkpoint = settings.ANEX_CHECKPOINTS.get(model_id)
    if checkpoint is None:
        return None
    return checkpoint_tokens(Path(checkpoint).resolve())
