"""Embedding rows through vLLM's pooling runner: one engine run per chunk, its texts
tokenized in one batch and its vectors cut and normalised as one matrix.

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

from pathlib import Path
from typing import Any

from inference.engines.forward import FORWARD
from inference.engines.runtime import llm_load
from inference.engines.types import EmbedOutcome, EmbedRow, RowError
from inference.tokens import checkpoint_tokens

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
        # The tokenizer the estimate counts with (inference/tokens.py), in batches.
        self.tokens = checkpoint_tokens(checkpoint.resolve())
        # Whether the tokenizer adds markers of its own is a property of the tokenizer, not
        # of a text: asked once. Where it adds none, one end-of-text token is appended.
        self.end_id: int | None = None
        if self._encode(["x"], marked=True) == self._encode(["x"], marked=False):
            end = self.tokenizer.convert_tokens_to_ids(END_OF_TEXT)
            if not isinstance(end, int) or end == self.tokenizer.unk_token_id:
                end = self.tokenizer.eos_token_id
            self.end_id = end if isinstance(end, int) else None

    def embed(self, rows: list[EmbedRow]) -> list[EmbedOutcome]:
        outcomes: list[EmbedOutcome | None] = [None] * len(rows)
        valid: list[int] = []
        for index, row in enumerate(rows):
            error = self._refusal(row)
            if error is not None:
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0, error=error)
            else:
                valid.append(index)
        accepted: list[tuple[int, list[int]]] = []
        for index, ids in zip(valid, self._tokens([rows[i].text for i in valid]), strict=True):
            if len(ids) > self.context_tokens:
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0,
                                               error=RowError.invalid_request(
                    f"This row is {len(ids):,} tokens, over the {self.context_tokens:,}-token "
                    f"context of model '{self.model_id}'. Shorten or split this row.",
                    code="context_length_exceeded", param="input"))
                continue
            accepted.append((index, ids))
        if accepted:
            vectors = self._pooled([ids for _, ids in accepted],
                                   [rows[index].dimensions for index, _ in accepted])
            for (index, ids), vector in zip(accepted, vectors, strict=True):
                outcomes[index] = EmbedOutcome(vector=vector, prompt_tokens=len(ids))
        return [outcome for outcome in outcomes if outcome is not None]

    def _pooled(self, prompts: list[list[int]], widths: list[int | None]) -> list[list[float]]:
        """One engine run; each pooled state cut to its row's width, then made unit length
        (unnormalised from the engine: truncating a unit vector would leave it short)."""
        import torch
        from vllm.pooling_params import PoolingParams

        with self.lock, FORWARD:  # its own engine's turn, then the process's forward pass
            results = self.llm.encode([{"prompt_token_ids": ids} for ids in prompts],
                                      pooling_params=PoolingParams(use_activation=False),
                                      pooling_task="embed", use_tqdm=False)
        states = torch.stack([result.outputs.data for result in results]).to(torch.float64)
        if len(set(widths)) == 1:  # the common chunk: one width, cut and scaled at once
            return _unit_rows(states, widths[0])
        return [_unit_rows(state.unsqueeze(0), width)[0]
                for state, width in zip(states, widths, strict=True)]

    def _encode(self, texts: list[str], *, marked: bool) -> list[list[int]]:
        if self.tokens is not None:
            return self.tokens.encode_batch_marked(texts) if marked \
                else self.tokens.encode_batch(texts)
        return [list(self.tokenizer.encode(text, add_special_tokens=marked)) for text in texts]

    def _tokens(self, texts: list[str]) -> list[list[int]]:
        """Each text with the checkpoint's own markers; where its tokenizer adds none, one
        end-of-text token appended (the reference: a string row is pooled there)."""
        encoded = self._encode(texts, marked=True)
        if self.end_id is not None:
            for ids in encoded:
                ids.append(self.end_id)
        return encoded

    def _refusal(self, row: EmbedRow) -> RowError | None:
        if isinstance(row.text, list):
            # The row checks take content parts on a VL model (priced at the media rate),
            # but this engine embeds text: until media serving exists the row is refused,
            # unbilled, rather than embedding the list's Python text.
            return RowError.invalid_request(
                f"This row's input is a list of content parts (images, video or text parts): "
                f"model '{self.model_id}' is served for text only for now. Send the input "
                "as a single string.", param="input")
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


def _unit_rows(states: Any, width: int | None) -> list[list[float]]:
    """Rows of a float64 matrix cut to `width` and scaled to unit length (an all-zero state
    has no direction to keep and is left as it is)."""
    import torch

    cut = states[:, :width] if width is not None else states
    norms = torch.linalg.vector_norm(cut, dim=1, keepdim=True)
    scaled = torch.where(norms > 0, cut / torch.where(norms > 0, norms, 1.0), cut)
    return list(scaled.tolist())
