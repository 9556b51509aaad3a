"""Embedding rows (/v1/embeddings): one vector per row, nothing generated; and the realtime
API's embeddings requests, which are batch text rows one request at a time.

The row checks themselves are inference.rows.embeddings; this kind says when they apply,
and what a checked row becomes when it is served.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from inference.constants import RowOutcome
from inference.engines import EmbedOutcome, EmbedRow, RowError
from inference.engines.embeddings import EmbeddingEngine, MediaCaps
from inference.kinds.base import (
    GENERATION_FIELDS,
    ParquetReading,
    RequestMalformed,
    RequestRefused,
    ServedJob,
    ServedRow,
    TaskKind,
    fields_refused,
    row_error_json,
)
from inference.kinds.media import PartPath
from inference.pricing import usd, usd_per_million
from inference.rows.core import (
    EMBEDDINGS,
    INLINE_ITEMS_PER_ROW,
    InputRejected,
    JobContext,
    JobOptions,
    RowCost,
    RowRef,
)
from inference.rows.embeddings import END_OF_TEXT_TOKENS, embedding_input, embedding_row
from inference.rows.media import MODALITY_OF
from inference.tokens import token_counter

if TYPE_CHECKING:
    from pathlib import Path

    from inference.catalog import CatalogModel
    from inference.engines.registry import Engine
    from inference.kinds.base import InputRow
    from inference.kinds.metering import RowMeter

INPUT = "input"  # a parquet input's content column

# The reference's realtime limits ("Realtime embeddings"): past any of them, a 400.
REALTIME_MAX_INPUTS = 128
REALTIME_MAX_INPUT_CHARS = 262_144
REALTIME_MAX_TOTAL_CHARS = 2_097_152


def media_caps(model: CatalogModel) -> MediaCaps | None:
    """The most media a row on this model carries, as the row checks cap it: the
    reference's pictures and clips per row, and a clip's frames at the fastest rate a job
    may sample (the model's fixed or highest video_fps) over its longest clip, never more
    than fit the context. None for a text model."""
    if not {"image", "video"} & set(model.modalities):
        return None
    media = model.media
    frames = 0
    if "video" in model.modalities and media.video_frame_tokens:
        frames = model.context_tokens // media.video_frame_tokens
        fps = media.video_fps_max or media.video_fps_default
        if media.video_max_seconds and fps:
            frames = min(frames, math.ceil(media.video_max_seconds * fps) + 1)
    return MediaCaps(
        images=INLINE_ITEMS_PER_ROW["image"] if "image" in model.modalities else 0,
        clips=INLINE_ITEMS_PER_ROW["video"] if frames else 0, frames=frames)


@runtime_checkable
class EmbedRunner(Protocol):
    """What an embedding kind calls: inference.engines.EmbeddingEngine."""

    def embed(self, rows: list[EmbedRow]) -> list[EmbedOutcome]: ...


def embeddings_body(model_id: str, vectors: Sequence[list[float] | str],
                    prompt_tokens: int) -> dict[str, Any]:
    """The embeddings list object, as an OpenAI-compatible server returns it: a batch row's
    one vector, or a realtime request's one per input, in input order."""
    return {"object": "list", "model": model_id,
            "data": [{"object": "embedding", "index": index, "embedding": vector}
                     for index, vector in enumerate(vectors)],
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens}}


def _vector(body: dict[str, Any] | None) -> list[float] | None:
    """A batch row's one vector, in its embeddings body; none for a failed row."""
    data = (body or {}).get("data") or [None]
    return data[0]["embedding"] if isinstance(data[0], dict) else None


@dataclass(frozen=True)
class EmbedRequest:
    """One realtime embeddings request, checked: an engine row per input string, in order,
    and its input tokens as the estimator counts a text row (each string plus the one
    end-of-text token it is pooled at); None where this deployment has no tokenizer for
    the model. What the request bills is the engine's own count (EmbedOutcome.prompt_tokens)."""

    rows: list[EmbedRow]
    input_tokens: int | None
    # Each input's tokens as the engine reads them (ModelTokens.prompt_counts), every one
    # within the model's context; None where this deployment has no tokenizer for it.
    prompt_tokens: tuple[int, ...] | None = None

    def forward(self, model_id: str) -> dict[str, Any]:
        """The body sent to the model's realtime engine server (EmbedKind.realtime_rows)."""
        return {"model": model_id, "input": [row.text for row in self.rows],
                "dimensions": self.rows[0].dimensions}


class EmbedParquet(ParquetReading):
    """An `input` column: one string per row, dimensions as the job sets them."""

    def content_column(self, columns: Collection[str]) -> str:
        if INPUT not in columns:
            raise InputRejected("A parquet input for an embedding model needs an 'input' "
                                "column.")
        return INPUT

    def row_cost(self, column: str, value: Any, *, job: JobContext, row: RowRef) -> RowCost:
        return embedding_input(value, job=job, row=row)

    def body(self, column: str, value: Any) -> dict[str, Any]:
        return {"input": value}


class EmbedKind(TaskKind[EmbedRow, EmbedOutcome, EmbedRunner]):
    runner = EmbedRunner
    runner_noun = "an embedding engine"
    task = "embed"
    endpoint = EMBEDDINGS
    noun = "an embedding model"
    realtime = True
    realtime_batch_rows = 256
    parquet: ClassVar[ParquetReading | None] = EmbedParquet()
    tokens_per_second = 50_000

    def fields_problem(self, model: CatalogModel, options: JobOptions) -> str | None:
        refused = fields_refused(options, GENERATION_FIELDS,
                                 f"the embedding model '{model.id}': it returns vectors, not "
                                 "generated text")
        if refused:
            return refused
        if options.dimensions is not None:
            return self.dimensions_problem(model, options.dimensions)
        return None

    def dimensions_problem(self, model: CatalogModel, dimensions: int) -> str | None:
        """A job's (or a realtime request's) dimensions outside the model's range."""
        low, high = model.dimensions_min, model.dimensions_native
        if low is None or high is None or not low <= dimensions <= high:
            return f"dimensions must be from {low} to {high} on '{model.id}'; got {dimensions}."
        return None

    def row_cost(self, body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
        return embedding_row(body, job=job, row=row)

    def engine_build(self, model: CatalogModel, checkpoint: Path) -> EmbeddingEngine:
        return EmbeddingEngine(model_id=model.id, checkpoint=checkpoint,
                               context_tokens=model.context_tokens,
                               dimensions_native=model.dimensions_native,
                               dimensions_min=model.dimensions_min,
                               media=media_caps(model))

    def media_paths(self, body: dict[str, Any]) -> list[PartPath]:
        parts = body.get("input")
        if not isinstance(parts, list):
            return []
        return [("input", j) for j, part in enumerate(parts)
                if isinstance(part, dict) and part.get("type") in MODALITY_OF]

    def engine_request(self, job: ServedJob, body: dict[str, Any]) -> EmbedRow:
        # A row's own dimensions win over the job's. The input goes as it is: a list of
        # content parts (a VL model's media row, its media decoded) is the engine's to read,
        # never embedded as the Python text of the list.
        return EmbedRow(text=body["input"], dimensions=body.get("dimensions") or job.dimensions)

    def engine_run(self, job: ServedJob, requests: list[EmbedRow]) -> list[EmbedOutcome]:
        return self.engine(job.model).embed(requests)

    def served(self, job: ServedJob, row: InputRow, outcome: EmbedOutcome,
               meter: RowMeter) -> ServedRow:
        if outcome.error is not None:
            return ServedRow.failed(outcome.error)
        assert outcome.vector is not None  # an outcome without an error carries its vector
        usage = meter.embedding(row.body, prompt_tokens=outcome.prompt_tokens,
                                engine_media=outcome.media_tokens)
        # The tokens the row is billed for: its media at the catalog's fixed tokens.
        billed = usage.input_tokens + usage.media_row_tokens
        return ServedRow(
            outcome=RowOutcome.SUCCESS, status_code=200,
            body=embeddings_body(job.model, [outcome.vector], billed), usage=usage)

    def parquet_output(self, records: list[dict[str, Any]]) -> tuple[str, Any]:
        """A vector per row, as float32 (the width the models compute in), read from the
        row's body: a chunk keeps each vector once (a second copy, under "embedding",
        doubled an embedding chunk's object and what every merge reads)."""
        import pyarrow as pa

        return "embedding", pa.array([_vector(item.get("body")) for item in records],
                                     pa.list_(pa.float32()))

    # -- the realtime API -------------------------------------------------------------------

    def realtime_request(self, model: CatalogModel, value: object, *,
                         dimensions: int | None = None, counted: bool = True) -> EmbedRequest:
        """One realtime request's `input` (a string or a list of strings) checked against
        the reference's realtime rules, then turned into engine rows at `dimensions` (None:
        native) and counted. RequestRefused at the first violation past a limit or for
        media (400), RequestMalformed for a value of the wrong type (422). `counted=False`
        skips the count (the web tier bills the engine's own; input_tokens is then None).

        Text only: content parts (images, video) stay on the batch API. Each string reaches
        the model verbatim, exactly as a batch text row does."""
        if dimensions is not None:
            problem = self.dimensions_problem(model, dimensions)
            if problem:
                raise RequestMalformed(problem)
        texts = [value] if isinstance(value, str) else value
        if not isinstance(texts, list):
            raise RequestMalformed("input must be a string or a list of strings.")
        if not texts:
            raise RequestRefused("input is an empty list: send at least one string.")
        # The count first: a list of any length costs one len() to refuse, not a walk.
        if len(texts) > REALTIME_MAX_INPUTS:
            raise RequestRefused(
                f"input has {len(texts):,} items, over the {REALTIME_MAX_INPUTS}-input limit "
                "of one request: split them across requests, or embed them on the batch API.")
        strings: list[str] = []
        for index, text in enumerate(texts):
            if isinstance(text, dict) or (isinstance(text, list) and text
                                          and all(isinstance(part, dict) for part in text)):
                raise RequestRefused(
                    f"input[{index}] is not text: realtime requests are text only. Embed "
                    "images and video on the batch API (embedding jobs); their vectors share "
                    "the space of a realtime text query on the same model and width.")
            if not isinstance(text, str):
                raise RequestMalformed(f"input[{index}] must be a string.")
            if not text:
                raise RequestRefused(f"input[{index}] is an empty string: every input needs "
                                     "text.")
            strings.append(text)
        total = 0
        for index, text in enumerate(strings):
            if len(text) > REALTIME_MAX_INPUT_CHARS:
                raise RequestRefused(
                    f"input[{index}] is {len(text):,} characters, over the "
                    f"{REALTIME_MAX_INPUT_CHARS:,}-character limit of one input.")
            total += len(text)
        if total > REALTIME_MAX_TOTAL_CHARS:
            raise RequestRefused(
                f"input is {total:,} characters in all, over the "
                f"{REALTIME_MAX_TOTAL_CHARS:,}-character limit of one request: split it "
                "across requests, or embed it on the batch API.")
        count = token_counter(model.id) if counted else None
        prompt = None if count is None else tuple(count.prompt_counts(strings))
        for index, tokens in enumerate(prompt or ()):
            if tokens > model.context_tokens:
                # The engine's own refusal, made here so no engine reads any of the inputs.
                raise RequestRefused(
                    f"input[{index}]: This row is {tokens:,} tokens, over the "
                    f"{model.context_tokens:,}-token context of model '{model.id}'. Shorten "
                    "or split this row.")
        return EmbedRequest(
            rows=[EmbedRow(text=text, dimensions=dimensions) for text in strings],
            input_tokens=None if count is None else sum(count(text) + END_OF_TEXT_TOKENS
                                                        for text in strings),
            prompt_tokens=prompt)

    def realtime_rows(self, body: dict[str, Any]) -> list[EmbedRow]:
        texts, dimensions = body.get("input"), body.get("dimensions")
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str)
                                                                for t in texts):
            raise ValueError("input must be a non-empty list of strings")
        if dimensions is not None and (isinstance(dimensions, bool)
                                       or not isinstance(dimensions, int)):
            raise ValueError("dimensions must be a whole number")
        return [EmbedRow(text=text, dimensions=dimensions) for text in texts]

    def realtime_run(self, engine: Engine, rows: list[EmbedRow]) -> list[dict[str, Any]]:
        """Per row its unit vector and the tokens the model read, or the model's refusal
        (an input longer than its context)."""
        assert isinstance(engine, EmbedRunner)
        return [{"embedding": out.vector, "prompt_tokens": out.prompt_tokens}
                if out.error is None and out.vector is not None
                else {"error": row_error_json(out.error
                                              or RowError.invalid_request("no vector"))}
                for out in engine.embed(rows)]

    def realtime_reply(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        return {"data": results}

    def pricing_section(self, models: list[CatalogModel]) -> list[str]:
        lines = [
            "## Embedding models",
            "",
            "A row is billed by its input tokens at one of two rates: text-only, or with media",
            "when it carries any image or video (its text included). Each image and video clip",
            "also adds a flat charge for the fetch and decode work it forces.",
            "",
            "| Model | Text-only rows (per 1M tokens) | Rows with media (per 1M tokens) "
            "| Per 1M images | Per 1M video clips | Realtime (per 1M tokens) | Minimum job |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for m in models:
            p = m.price
            media = "image" in m.modalities or "video" in m.modalities
            lines.append(
                f"| `{m.id}` | {usd(p.input_per_mtok)} "
                f"| {usd(p.media_row_rate) if media else '-'} | {usd_per_million(p.per_image)} "
                f"| {usd_per_million(p.per_clip)} | {usd(p.realtime_input_per_mtok)} "
                f"| {usd(p.minimum_job) if p.minimum_job else '-'} |"
            )
        return lines
