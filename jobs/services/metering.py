"""What a served row is billed: billing.pricing.Usage from the engine's own token counts,
with the media the row carries (images, clips, their billed seconds, the tokens they
encode to) counted by the same rules the estimate counted them (jobs.validation), so the
final charge and the estimate go through one `price()` over the same kinds of usage.

The engine reports one prompt_tokens figure; a chat row's media part of it is the
reference's formula (tokens per image, per second of audio, per sampled video frame), billed
at the media input rate, and the rest at the text rate. An embedding row carrying any image
or video bills all its tokens at the media-row rate. Rows without media take the fast path.
"""

from __future__ import annotations

import dataclasses
import logging
from decimal import Decimal
from typing import Any

from django.db.models import BigIntegerField, DecimalField, QuerySet, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from billing.pricing import Usage
from inference.catalog import CatalogModel
from jobs.models import Chunk, Job
from jobs.validation.chat import chat_cost
from jobs.validation.core import InputRejected, JobContext, JobOptions, RowCost, RowRef
from jobs.validation.embeddings import embedding_input

logger = logging.getLogger(__name__)

_ROW = RowRef("Row")


def usage_json(usage: Usage) -> dict[str, Any]:
    """A Usage as a JSON object (Decimal seconds as a string, never a float)."""
    return {k: str(v) if isinstance(v, Decimal) else v
            for k, v in dataclasses.asdict(usage).items()}


# Chunk usage written before embedding rows with media were billed at one media-row rate
# split those tokens by images and video; a chunk stored then still settles.
_USAGE_RENAMED = {"image_row_tokens": "media_row_tokens", "video_row_tokens": "media_row_tokens"}


def usage_from_json(raw: dict[str, Any]) -> Usage:
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        name = _USAGE_RENAMED.get(key, key)
        amount = Decimal(value) if name == "media_seconds" else value
        fields[name] = fields.get(name, 0) + amount
    return Usage(**fields)


def usage_sum(chunks: QuerySet[Chunk]) -> Usage:
    """These chunks' usage added up in the database (the hold is checked before every
    chunk, so the chunks are never all read into Python)."""
    totals = chunks.aggregate(**{
        name: Sum(Cast(KeyTextTransform(name, "usage"),
                       DecimalField(max_digits=30, decimal_places=9)
                       if name == "media_seconds" else BigIntegerField()))
        for name in [f.name for f in dataclasses.fields(Usage)] + list(_USAGE_RENAMED)})
    return usage_from_json({name: value for name, value in totals.items()
                            if value is not None})


def _text_uncounted(text: str) -> int:
    # Only the media are counted here: the text's tokens are the engine's own count.
    return 0


class RowMeter:
    """One per engine call: turns each served row's token counts into its Usage."""

    def __init__(self, job: Job, model: CatalogModel | None) -> None:
        self.context: JobContext | None = None
        if model is not None and set(model.modalities) - {"text"}:
            # No output cap and no text tokens: the row passed every check while
            # estimating; here its media are only counted, never refused again.
            self.context = JobContext(JobOptions(model=model, video_fps=job.video_fps),
                                      _text_uncounted, None)

    def _media(self, count: Any) -> RowCost | None:
        try:
            cost: RowCost = count()
        except InputRejected:
            # Cannot happen for a row the estimate admitted; never fails a served row.
            logger.exception("a served row's media could not be counted")
            return None
        return cost

    def chat(self, body: dict[str, Any], *, prompt_tokens: int,
             completion_tokens: int) -> Usage:
        messages = body.get("messages")
        if self.context is None or not isinstance(messages, list) or not any(
                isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages):
            return Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens)
        context = self.context
        cost = self._media(lambda: chat_cost(messages, job=context, row=_ROW))
        if cost is None or not (cost.images or cost.clips or cost.media_tokens):
            return Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens)
        return Usage(input_tokens=max(prompt_tokens - cost.media_tokens, 0),
                     media_tokens=cost.media_tokens, output_tokens=completion_tokens,
                     images=cost.images, clips=cost.clips, media_seconds=cost.media_seconds)

    def embedding(self, body: dict[str, Any], *, prompt_tokens: int) -> Usage:
        value = body.get("input")
        if self.context is None or not isinstance(value, list):
            return Usage(input_tokens=prompt_tokens)
        context = self.context
        cost = self._media(lambda: embedding_input(value, job=context, row=_ROW))
        if cost is None or not cost.media_row:
            return Usage(input_tokens=prompt_tokens)
        return Usage(media_row_tokens=prompt_tokens, images=cost.images, clips=cost.clips,
                     media_seconds=cost.media_seconds)

