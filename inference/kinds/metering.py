"""What a served row is billed: inference.pricing.Usage from the engine's own token counts,
with the media the row carries (images, clips, their billed seconds, the tokens they
encode to) counted by the same rules the estimate counted them (inference.rows), so the
final charge and the estimate go through one `price()` over the same kinds of usage.

A row's media are billed at the catalog's fixed tokens (the reference: "Media costs a fixed
number of those tokens per model" - per image, per second of audio, per sampled video
frame), never at what the engine's processor made of them, and its text at the engine's
own count: the engine's prompt_tokens less its own media tokens (`engine_media`, where the
engine reports them; where it does not, the catalog's media tokens are taken out of its
count instead). A chat row's media tokens are billed at the media input rate and its text
at the text rate; an embedding row carrying any image or video bills its text and media
tokens at the media-row rate. What a row bills is also what its result's usage says
(docs/dev/decisions/2026-12-06-media-tokens-billed.md). Rows without media take the fast
path.

A chat row's cached input tokens (what the engine's prefix cache held of its prompt, all of
it on a copy of an identical row) are reported in its usage and billed at the input rate
as the rest: the hold is computed before any engine cache exists, and the charge never
exceeds it (docs/dev/decisions/2026-12-06-identical-rows-and-cached-tokens.md). An
embedding or decision row reports none.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from anex.logsafe import exception_summary
from inference.catalog import CatalogModel
from inference.kinds import kind_for
from inference.kinds.base import ServedJob
from inference.kinds.media import media_context
from inference.pricing import Usage
from inference.rows.chat import chat_cost
from inference.rows.core import InputRejected, JobContext, RowCost, RowRef
from inference.rows.embeddings import embedding_input

logger = logging.getLogger(__name__)

_ROW = RowRef("Row")


class RowMeter:
    """One per engine call: turns each served row's token counts into its Usage."""

    def __init__(self, job: ServedJob, model: CatalogModel | None) -> None:
        # The row passed every check while estimating; here its media are only counted,
        # never refused again (and the chunk's media are resolved by the same rules).
        self.context: JobContext | None = None if model is None \
            else media_context(job, model, kind_for(model))

    def _media(self, count: Any) -> RowCost | None:
        try:
            cost: RowCost = count()
        except InputRejected as rejected:
            # Cannot happen for a row the estimate admitted; never fails a served row. Its
            # message names the row's parts (anex.logsafe): the class and place only.
            logger.error("a served row's media could not be counted: %s",
                         exception_summary(rejected))
            return None
        return cost

    def chat(self, body: dict[str, Any], *, prompt_tokens: int, completion_tokens: int,
             engine_media: int | None = None, cached_tokens: int = 0) -> Usage:
        """`cached_tokens`: the engine's prompt tokens it did not compute (reported, billed
        at the input rate as the rest), held within the prompt the row is billed for; a
        prompt the engine computed none of (a copy of an identical row) is cached whole,
        its media at the catalog's tokens as billed."""
        usage = self._chat(body, prompt_tokens=prompt_tokens,
                           completion_tokens=completion_tokens, engine_media=engine_media)
        if not cached_tokens:
            return usage
        billed = usage.input_tokens + usage.media_tokens
        cached = billed if cached_tokens >= prompt_tokens else min(cached_tokens, billed)
        return dataclasses.replace(usage, cached_input_tokens=cached)

    def _chat(self, body: dict[str, Any], *, prompt_tokens: int, completion_tokens: int,
              engine_media: int | None) -> Usage:
        messages = body.get("messages")
        if self.context is None or not isinstance(messages, list) or not any(
                isinstance(m, dict) and isinstance(m.get("content"), list) for m in messages):
            return Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens)
        context = self.context
        cost = self._media(lambda: chat_cost(messages, job=context, row=_ROW))
        if cost is None or not (cost.images or cost.clips or cost.media_tokens):
            return Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens)
        return Usage(input_tokens=_text_tokens(prompt_tokens, engine_media, cost),
                     media_tokens=cost.media_tokens, output_tokens=completion_tokens,
                     images=cost.images, clips=cost.clips, media_seconds=cost.media_seconds)

    def embedding(self, body: dict[str, Any], *, prompt_tokens: int,
                  engine_media: int | None = None) -> Usage:
        value = body.get("input")
        if self.context is None or not isinstance(value, list):
            return Usage(input_tokens=prompt_tokens)
        context = self.context
        cost = self._media(lambda: embedding_input(value, job=context, row=_ROW))
        if cost is None or not cost.media_row:
            return Usage(input_tokens=prompt_tokens)
        return Usage(media_row_tokens=_text_tokens(prompt_tokens, engine_media, cost)
                     + cost.media_tokens, images=cost.images, clips=cost.clips,
                     media_seconds=cost.media_seconds)


def _text_tokens(prompt_tokens: int, engine_media: int | None, cost: RowCost) -> int:
    """The row's text as the engine read it: its prompt less its own media tokens, or,
    where the engine does not say them, less the catalog's."""
    media = cost.media_tokens if engine_media is None else engine_media
    return max(prompt_tokens - media, 0)
