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
    tokens.chat_prompt(messages, kwargs)      # the prompt the chat engine serves (ChatPrompt)
    tokens.encode_prompts(prompts)            # its token ids, as the engine sends them

A chat prompt is encoded in two ways (inference.chat_template.ChatPrompt): the template's
scaffolding with the tokenizer as it is, its markup becoming the model's special tokens, and
the conversation's content as plain text, with a copy of the tokenizer that knows no added
tokens at all (`content_tokenizer`: neither the special ones such as <|im_end|> nor the
plain added ones such as Qwen3's </think>). Each part is encoded on its own and the ids are
joined: a part's edge is a token's edge. The chat engine renders every row through
ChatTemplate.prompt and sends these ids to vLLM as they are (inference.engines.chat), and
the row checker counts the same parts the same way (inference.token_pieces), so the
estimate's count of a text row and the served prompt_tokens are one computation and cannot
drift.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from django.conf import settings
from tokenizers import Tokenizer

from inference.chat_template import ChatPrompt, ChatTemplate
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

    def count_batch(self, texts: Sequence[str | ChatPrompt]) -> list[int]:
        """Each text's count, in one call (the Rust tokenizer's batch, no offsets kept); a
        chat prompt's as encode_prompts encodes it."""
        plain = [text for text in texts if type(text) is str]
        counts = iter([len(encoding) for encoding in
                       self.tokenizer.encode_batch_fast(plain, add_special_tokens=False)])
        prompts = [text for text in texts if isinstance(text, ChatPrompt)]
        prompt_counts = iter(map(len, self.encode_prompts(prompts)))
        return [next(counts) if type(text) is str else next(prompt_counts) for text in texts]

    @cached_property
    def content_tokenizer(self) -> Tokenizer:
        """The tokenizer with no added tokens: what a message's text is encoded with, so
        that `<|im_end|>` or `</think>` in it is its characters, never the model's token."""
        config = json.loads(self.tokenizer.to_str())
        config["added_tokens"] = []
        return Tokenizer.from_str(json.dumps(config))

    def encode_prompts(self, prompts: Sequence[ChatPrompt]) -> list[list[int]]:
        """Each prompt's token ids, as the chat engine sends them: every scaffolding part
        with the model's special tokens, every content part as text, joined in order."""
        scaffolding = [part for prompt in prompts for part in prompt.layout.scaffolding]
        content = [text for prompt in prompts for text in prompt.content]
        framed = iter(self.encode_batch(scaffolding))
        texts = iter([encoding.ids for encoding in self.content_tokenizer.encode_batch_fast(
            content, add_special_tokens=False)])
        encoded = []
        for prompt in prompts:
            ids = list(next(framed))
            for _ in prompt.layout.slots:
                ids += next(texts)
                ids += next(framed)
            encoded.append(ids)
        return encoded

    def counting(self) -> PieceCounts | None:
        """A counter for one file's texts that tokenizes each repeated piece (a shared
        system prompt, the template's role headers) once (inference.token_pieces); None
        where this tokenizer's counts cannot be taken piecewise exactly."""
        split = self._splitter
        return PieceCounts(self.tokenizer, split, self.content_tokenizer) \
            if split is not None else None

    @cached_property
    def _splitter(self) -> Callable[[str], list[str]] | None:
        return PieceCounts.splitter(self.tokenizer)

    def chat_prompt(self, messages: list[dict[str, Any]],
                    kwargs: dict[str, Any]) -> ChatPrompt | None:
        """The prompt the chat engine serves for these messages (ChatTemplate.prompt);
        None without a template."""
        if self.template is None:
            return None
        return self.template.prompt(messages, kwargs)


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
