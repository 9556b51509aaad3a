"""Counting many texts with a tokenizer, each repeated piece tokenized once.

A rendered chat prompt is mostly the same few pieces (a system prompt every row shares, the
role headers, the generation prompt) around each row's own text. A Hugging Face tokenizer
cuts a text at its added tokens (<|im_start|>, <|im_end|>, ...) before anything else:
the pieces between them are normalized, pre-tokenized and tokenized each on its own, and
each added token is one token. So a text's count is the sum of its pieces' counts plus one
per added token, and a piece already counted in this file need not be tokenized again.

That holds only for the added tokens the tokenizer cuts on before normalizing
(normalized=False) and only when none of them eats the whitespace beside it (lstrip, rstrip,
single_word), and not for a pre-tokenizer that treats the first piece of a text apart
(Metaspace's prepend_scheme "first", sentencepiece-style). `PieceCounts.splitter` says None
for such a tokenizer, and for any whose piecewise counts differ from its whole counts on a
probe corpus: the caller then counts whole texts. Exactness is held by
tests/unit/test_token_pieces.py on the local checkpoints.

A chat prompt (inference.chat_template.ChatPrompt) is counted as the engine encodes it, part
by part: its scaffolding (the same few strings for every row of one layout, counted once per
layout, cut at added tokens as above) plus each content piece's count as text, by the
content tokenizer (no added tokens), from a memo of its own: `<|im_end|>` is one token in
the scaffolding and several in content.

One PieceCounts per file checked (JobContext), never shared: its memo is that file's. It
remembers only short pieces, and only so many characters of them: a file of unique long
messages would otherwise keep its whole text (several times its size) in the estimate's
memory.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence

import numpy as np
from tokenizers import Tokenizer

from inference.chat_template import ChatPrompt, PromptLayout

# The memo is emptied when it holds this many pieces, or this many characters of them (a
# file's repeated pieces come back at once; its unique ones would otherwise pile up): at
# most 8 Mi characters, 32 MiB of text at 4 bytes a character, plus the entries.
MEMO_PIECES = 65_536
MEMO_CHARS = 8 * 1024 * 1024
# A piece longer than this is counted each time it comes and never remembered: what repeats
# across a file's rows (a system prompt, the role headers) is shorter, and one tokenizing of
# a long piece costs little beside its own length.
MEMO_PIECE_CHARS = 16_384
# Texts the self-check at load counts both ways: added tokens at the edges, inside words,
# beside spaces and newlines, twice in a row, and non-ASCII text.
_PROBES = (
    "{0}user\nhello there{1}\n{0}assistant\n",
    " {1} leading and trailing spaces {0} ",
    "word{0}word{1}{1}\n\n{0}\n",
    "\n\n{0}  \t{1}\r\n",
    "héllo wörld {0}日本語のテキスト{1} ünïcödé 🎉",
    "{0}{1}",
    "plain text without any added token, and more of it.",
)


class PieceCounts:
    """Token counts of texts, each text's pieces between added tokens counted once per
    file; and of chat prompts (inference.chat_template.ChatPrompt), their scaffolding so
    and their content pieces, as text, with the content tokenizer (inference.tokens)."""

    def __init__(self, tokenizer: Tokenizer, split: Callable[[str], list[str]],
                 content_tokenizer: Tokenizer | None = None) -> None:
        self._tokenizer = tokenizer
        self._content_tokenizer = content_tokenizer
        self._split = split
        self._memo: dict[str, int] = {"": 0}
        self._memo_chars = 0
        # Content pieces count differently ("<|im_end|>" is one token in the scaffolding,
        # several in content): a memo of their own, bounded alike.
        self._content_memo: dict[str, int] = {"": 0}
        self._content_chars = 0
        # Each prompt layout's scaffolding count (a file has a handful of layouts).
        self._layouts: dict[PromptLayout, int] = {}

    @classmethod
    def splitter(cls, tokenizer: Tokenizer) -> Callable[[str], list[str]] | None:
        """How to cut a text at this tokenizer's added tokens, or None where piecewise
        counts would not be exact (see the module docstring). Decided once per tokenizer:
        it reads the tokenizer's whole configuration."""
        split = _splitter(tokenizer)
        if split is None:
            return None
        added = [token.content for token in _cut_tokens(tokenizer)]  # type: ignore[attr-defined]
        probes = [probe.format(added[0], added[-1]) for probe in _PROBES]
        whole = [len(encoding) for encoding in
                 tokenizer.encode_batch_fast(probes, add_special_tokens=False)]
        return split if cls(tokenizer, split).count_batch(probes) == whole else None

    def count_batch(self, texts: Sequence[str | ChatPrompt]) -> list[int]:
        """Each text's count, exactly as the tokenizer counts it whole; each chat prompt's
        as ModelTokens.encode_prompts encodes it."""
        plan = self.plan(texts)
        return plan.finish(plan.encode())

    def plan(self, texts: Sequence[str | ChatPrompt]) -> PiecePlan:
        """The count of texts in steps (PiecePlan), so that the tokenizing may run on
        another thread while this one goes on."""
        split, layouts = self._split, self._layouts
        flat: list[str] = []  # pieces between added tokens, counted by the tokenizer
        flat_owners: list[int] = []
        content: list[str] = []  # content pieces, counted by the content tokenizer
        content_owners: list[int] = []
        fixed = np.zeros(len(texts), np.int64)  # added tokens cut out, known scaffolding
        for at, text in enumerate(texts):
            if type(text) is str:
                pieces = split(text)
                flat += pieces
                flat_owners += [at] * len(pieces)
                fixed[at] = len(pieces) - 1  # n pieces are cut by n - 1 added tokens
            else:
                assert isinstance(text, ChatPrompt)
                layout = text.layout
                framing = layouts.get(layout)
                if framing is None:
                    framing = layouts[layout] = sum(self.count_batch(list(layout.scaffolding)))
                fixed[at] = framing
                pieces = text.content
                content += pieces
                content_owners += [at] * len(pieces)
        looked = list(map(self._memo.get, flat))
        new = list({piece for piece, count in zip(flat, looked, strict=True) if count is None})
        content_looked = list(map(self._content_memo.get, content))
        content_new = list({piece for piece, count in zip(content, content_looked, strict=True)
                            if count is None})
        return PiecePlan(self, (new, flat, looked, flat_owners),
                         (content_new, content, content_looked, content_owners), fixed)

    def _learn(self, counted: dict[str, int], content: dict[str, int]) -> None:
        self._memo_chars = _remember(self._memo, self._memo_chars, counted)
        self._content_chars = _remember(self._content_memo, self._content_chars, content)


def _remember(memo: dict[str, int], chars: int, counted: dict[str, int]) -> int:
    """The memo with the short pieces of `counted` learnt, emptied whenever it would hold
    too many pieces or characters; the characters it then holds."""
    for piece, count in counted.items():
        size = len(piece)
        if size > MEMO_PIECE_CHARS:
            continue
        if len(memo) >= MEMO_PIECES or chars + size > MEMO_CHARS:
            memo.clear()
            memo[""] = 0
            chars = 0
        memo[piece] = count
        chars += size
    return chars


# A plan's pieces of one kind: those not yet counted, all of them in order, what the memo
# knew of each (None: not known), and which text each belongs to.
_Pieces = tuple[list[str], list[str], list["int | None"], list[int]]


class PiecePlan:
    """One batch's count in three steps: planned (its pieces cut and looked up in the memo,
    PieceCounts.plan), encoded (`encode`: its new pieces tokenized, touching no Python
    state, so on any thread), finished (`finish`, back on the planning thread: each text's
    sum, and the memo learns the new pieces)."""

    __slots__ = ("_content", "_fixed", "_owner", "_pieces", "new")

    def __init__(self, owner: PieceCounts, pieces: _Pieces, content: _Pieces,
                 fixed: np.ndarray) -> None:
        self._owner = owner
        self._pieces = pieces
        self._content = content
        self._fixed = fixed
        self.new = pieces[0] + content[0]

    def encode(self) -> list[int]:
        """The new pieces' counts (the Rust tokenizer, without the GIL): the plain ones,
        then the content ones."""
        owner, new, content_new = self._owner, self._pieces[0], self._content[0]
        counts = [len(encoding) for encoding in owner._tokenizer.encode_batch_fast(
            new, add_special_tokens=False)] if new else []
        if content_new:
            assert owner._content_tokenizer is not None, "chat prompts need the content tokenizer"
            counts += [len(encoding) for encoding in owner._content_tokenizer.encode_batch_fast(
                content_new, add_special_tokens=False)]
        return counts

    def finish(self, counts: list[int]) -> list[int]:
        """Each text's count, given `encode`'s answer."""
        size = len(self._fixed)
        if not size:
            return []
        new, content_new = self._pieces[0], self._content[0]
        counted = dict(zip(new, counts[:len(new)], strict=True))
        content_counted = dict(zip(content_new, counts[len(new):], strict=True))
        totals = self._fixed + _summed(self._pieces, counted, size) \
            + _summed(self._content, content_counted, size)
        self._owner._learn(counted, content_counted)
        return totals.tolist()  # type: ignore[no-any-return]


def _summed(pieces: _Pieces, counted: dict[str, int], size: int) -> np.ndarray:
    """Each text's sum of its pieces' counts (a text may have none)."""
    _, flat, looked, owners = pieces
    if not flat:
        return np.zeros(size, np.int64)
    per_piece = np.fromiter(
        (known if known is not None else counted[piece]
         for piece, known in zip(flat, looked, strict=True)), np.int64, len(flat))
    return np.bincount(np.array(owners, np.int64), weights=per_piece,
                       minlength=size).astype(np.int64)


def _cut_tokens(tokenizer: Tokenizer) -> list[object]:
    return [token for token in tokenizer.get_added_tokens_decoder().values()
            if not token.normalized]


def _splitter(tokenizer: Tokenizer) -> Callable[[str], list[str]] | None:
    if getattr(tokenizer, "encode_special_tokens", False):
        return None  # special tokens are then tokenized as text, not cut out
    tokens = _cut_tokens(tokenizer)
    if not tokens or any(token.lstrip or token.rstrip or token.single_word  # type: ignore[attr-defined]
                         for token in tokens):
        return None
    config = json.loads(tokenizer.to_str())
    if "Metaspace" in json.dumps([config.get("pre_tokenizer"), config.get("normalizer")]):
        return None
    # Longest first: at one position the longest added token wins, as the tokenizer's own
    # leftmost-longest match does.
    contents = sorted((token.content for token in tokens), key=len, reverse=True)  # type: ignore[attr-defined]
    return re.compile("|".join(map(re.escape, contents))).split
