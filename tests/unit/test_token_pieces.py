"""Counting texts piece by piece between a tokenizer's added tokens (inference/token_pieces.py):
exact wherever it is used, refused where the tokenizer would make it inexact."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

from inference import token_pieces
from inference.token_pieces import PieceCounts
from inference.tokens import checkpoint_tokens

# checkpoint_dirs: the local tiny-qwen3 and MiniLM checkpoints, built once (engine tier).
pytest_plugins = ["tests.engine_fixtures"]

CORPUS = ["the quick brown fox jumps over the lazy dog", "héllo wörld, ünïcödé text",
          "batch inference counts every token", "日本語のテキスト and emoji 🎉"] * 50


def texts(specials: list[str], count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    pieces = ["hello", " world", "\n", "\n\n", "  ", "\t", "héllo", "日本", "🎉", ".", "x",
              "Answer in one short sentence.", " ", "\r\n", "don't", "123", ""]
    return ["".join(rng.choice(pieces + specials * 2) for _ in range(rng.randint(0, 30)))
            for _ in range(count)]


def trained(pre_tokenizer: pre_tokenizers.PreTokenizer,
            specials: Sequence[str | AddedToken]) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["[UNK]"]))
    tokenizer.add_special_tokens(list(specials))
    return tokenizer


def whole(tokenizer: Tokenizer, batch: list[str]) -> list[int]:
    return [len(encoding) for encoding in
            tokenizer.encode_batch_fast(batch, add_special_tokens=False)]


def test_piecewise_counts_equal_whole_counts_on_a_byte_level_tokenizer() -> None:
    specials = ["<|im_start|>", "<|im_end|>", "<think>", "</think>"]
    tokenizer = trained(pre_tokenizers.ByteLevel(add_prefix_space=False), specials)
    split = PieceCounts.splitter(tokenizer)
    assert split is not None
    counts = PieceCounts(tokenizer, split)
    for seed in range(5):  # the memo carries over from batch to batch
        batch = texts(specials, 500, seed)
        assert counts.count_batch(batch) == whole(tokenizer, batch)


def test_the_memo_is_emptied_when_full_and_counts_stay_exact(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_pieces, "MEMO_PIECES", 10)
    specials = ["<|im_end|>"]
    tokenizer = trained(pre_tokenizers.ByteLevel(add_prefix_space=False), specials)
    split = PieceCounts.splitter(tokenizer)
    assert split is not None
    counts = PieceCounts(tokenizer, split)
    for seed in range(3):
        batch = texts(specials, 300, seed)
        assert counts.count_batch(batch) == whole(tokenizer, batch)
        # at most the cap, plus one batch's own pieces
        assert len(counts._memo) <= 10 + 1 + len({piece for text in batch
                                                  for piece in split(text)})
    assert counts.count_batch([]) == []


@pytest.mark.parametrize("tokenizer", [
    # sentencepiece-style: only a text's first piece gets its prefix
    pytest.param(lambda: trained(pre_tokenizers.Metaspace(prepend_scheme="first"),
                                 ["<s>", "</s>"]), id="metaspace"),
    # an added token that eats the whitespace beside it
    pytest.param(lambda: trained(pre_tokenizers.Whitespace(),
                                 [AddedToken("<mask>", lstrip=True)]), id="lstrip"),
])
def test_a_tokenizer_that_cannot_be_counted_piecewise_is_counted_whole(tokenizer: object) -> None:
    assert PieceCounts.splitter(tokenizer()) is None  # type: ignore[operator]


@pytest.mark.parametrize("name", ["tiny-qwen3", "minilm"])
def test_the_local_checkpoints_count_piecewise_exactly(
        checkpoint_dirs: dict[str, Path], name: str) -> None:
    tokens = checkpoint_tokens(checkpoint_dirs[name].resolve())
    assert tokens is not None
    counting = tokens.counting()
    assert counting is not None  # both are cut at their added tokens
    specials = [token.content for token in tokens.tokenizer.get_added_tokens_decoder().values()]
    batch = texts(specials, 2000, 3)
    if tokens.template is not None:  # and whole prompts as the engine renders them
        batch += [tokens.template.render([{"role": "system", "content": text},
                                          {"role": "user", "content": text[::-1]}], {})
                  for text in texts(specials, 200, 4)]
    assert counting.count_batch(batch) == tokens.count_batch(batch)


def test_a_file_of_unique_long_messages_is_not_kept_in_the_memo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Issue 22, M3: the memo kept every unique piece, so a 2 GiB input of unique long
    # messages held its whole text several times over. Smaller bounds, the same attack.
    monkeypatch.setattr(token_pieces, "MEMO_CHARS", 20_000)
    monkeypatch.setattr(token_pieces, "MEMO_PIECE_CHARS", 2_000)
    specials = ["<|im_start|>", "<|im_end|>"]
    tokenizer = trained(pre_tokenizers.ByteLevel(add_prefix_space=False), specials)
    split = PieceCounts.splitter(tokenizer)
    assert split is not None
    counts = PieceCounts(tokenizer, split)
    rng = random.Random(7)
    words = ["the", "quick", "héllo", "日本", "batch", "🎉", "dog"]
    header = "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\n"
    for size in (1_500, 2_500, 50_000):  # short, over the piece bound, far over both
        batch = [header + " ".join(rng.choice(words) for _ in range(size // 5))
                 + f" {n}<|im_end|>" for n in range(40)]
        assert counts.count_batch(batch) == whole(tokenizer, batch)
        assert counts._memo_chars == sum(map(len, counts._memo)) <= 20_000
        assert all(len(piece) <= 2_000 for piece in counts._memo)
    # the shared header pieces are still remembered (the memo's purpose)
    assert "system\nAnswer briefly." in counts._memo
