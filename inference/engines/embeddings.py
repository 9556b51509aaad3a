"""Embedding rows through vLLM's pooling runner: one engine run per chunk.

What reaches the model is the row's text, verbatim: no instruction, no template (the
reference's "How embedding inputs are processed"). The checkpoint's own tokenizer adds its
own markers (MiniLM: [CLS] ... [SEP]); where it adds none, one end-of-text token is appended,
the position a last-token checkpoint pools.

Pooling is the checkpoint's own, as vLLM reads it from the checkpoint: last-token for the
Qwen3 embedding models ("the pooling these checkpoints are built for"), mean pooling for
all-MiniLM-L6-v2, whose sentence-transformers config declares it (last-token pooling on a
BERT encoder would pool its [SEP] state and throw the model's training away). The engine
takes the pooled vector unnormalised, keeps its first `dimensions` values, and only then
normalises to unit length: truncating a unit vector would leave it shorter than 1.

prompt_tokens is what the model read: for MiniLM that is its [CLS] and [SEP] around the
text (the estimator's text-plus-one count is one short of that on this checkpoint).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from inference.engines.runtime import llm_load
from inference.engines.types import EmbedOutcome, EmbedRow, RowError

END_OF_TEXT = "<|endoftext|>"


class EmbeddingEngine:
    def __init__(self, *, model_id: str, checkpoint: Path, context_tokens: int,
                 dimensions_native: int | None, dimensions_min: int | None) -> None:
        self.model_id = model_id
        self.checkpoint = checkpoint
        loaded = llm_load(checkpoint, runner="pooling", max_model_len=context_tokens)
        self.llm = loaded.llm
        self.lock = loaded.lock
        self.load_seconds = loaded.seconds
        self.tokenizer = self.llm.get_tokenizer()
        self.context_tokens = min(context_tokens, int(self.llm.model_config.max_model_len))
        self.dimensions_native = dimensions_native or int(self.llm.model_config.embedding_size)
        self.dimensions_min = dimensions_min or 1

    def embed(self, rows: list[EmbedRow]) -> list[EmbedOutcome]:
        from vllm.pooling_params import PoolingParams

        outcomes: list[EmbedOutcome | None] = [None] * len(rows)
        accepted: list[tuple[int, list[int]]] = []
        for index, row in enumerate(rows):
            error = self._refusal(row)
            if error is not None:
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0, error=error)
                continue
            ids = self._tokens(row.text)
            if len(ids) > self.context_tokens:
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0,
                                               error=RowError.invalid_request(
                    f"This row is {len(ids):,} tokens, over the {self.context_tokens:,}-token "
                    f"context of model '{self.model_id}'. Shorten or split this row.",
                    code="context_length_exceeded", param="input"))
                continue
            accepted.append((index, ids))
        if accepted:
            with self.lock:
                results = self.llm.embed(
                    [{"prompt_token_ids": ids} for _, ids in accepted],
                    # Unnormalised: the width is cut first, then normalised (see above).
                    pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
            for (index, ids), result in zip(accepted, results, strict=True):
                outcomes[index] = EmbedOutcome(
                    vector=_unit(result.outputs.embedding, rows[index].dimensions),
                    prompt_tokens=len(ids))
        return [outcome for outcome in outcomes if outcome is not None]

    def _tokens(self, text: str) -> list[int]:
        """The text with the checkpoint's own markers; where its tokenizer adds none, one
        end-of-text token appended (the reference: a string row is pooled there)."""
        ids = list(self.tokenizer.encode(text, add_special_tokens=True))
        if ids == list(self.tokenizer.encode(text, add_special_tokens=False)):
            end = self.tokenizer.convert_tokens_to_ids(END_OF_TEXT)
            if not isinstance(end, int) or end == self.tokenizer.unk_token_id:
                end = self.tokenizer.eos_token_id
            if isinstance(end, int):
                ids.append(end)
        return ids

    def _refusal(self, row: EmbedRow) -> RowError | None:
        if not isinstance(row.text, str) or not row.text:
            return RowError.invalid_request("embeddings input must be a non-empty string",
                                            param="input")
        width = row.dimensions
        if width is not None and (isinstance(width, bool) or not isinstance(width, int)
                                  or not self.dimensions_min <= width <= self.dimensions_native):
            return RowError.invalid_request(
                f"dimensions must be a whole number from {self.dimensions_min} to "
                f"{self.dimensions_native} on model '{self.model_id}', not {width!r}",
                param="dimensions")
        return None


def _unit(vector: Any, dimensions: int | None) -> list[float]:
    values = [float(x) for x in vector]
    if dimensions is not None:
        values = values[:dimensions]
    norm = math.sqrt(math.fsum(x * x for x in values))
    if norm == 0.0:
        return values  # an all-zero state has no direction to keep
    return [x / norm for x in values]
