"""What a served row is billed: inference.pricing.Usage from the engine's own token counts,
with the media the row carries (images, clips, their billed seconds, the tokens they
encode to) counted by the same rules the estimate counted them (inference.rows), so the
final charge and the estimate go through one `price()` over the same kinds of usage.

The engine reports one prompt_tokens figure; a chat row's media part of it is the
reference's formula (tokens per image, per second of audio, per sampled video frame), billed
at the media input rate, and the rest at the text rate. An embedding row carrying any image
or video bills all its tokens at the media-row rate. Rows without media take the fast path.
"""

from __future__ import annotations

import logging
from typing import Any

from anex.logsafe import exception_summary
from inference.catalog import CatalogModel
from inference.kinds import kind_for
from inference.kinds.base import ServedJob
from inference.pricing import Usage
from inference.rows.chat import chat_cost
from inference.rows.core import InputRejected, JobContext, JobOptions, RowCost, RowRef
from inference.rows.embeddings import embedding_input
from inference.tokens import uncounted

logger = logging.getLogger(__name__)

_ROW = RowRef("Row")


class RowMeter:
    """One per engine call: turns each served row's token counts into its Usage."""

    def __init__(self, job: ServedJob, model: CatalogModel | None) -> None:
        self.context: JobContext | None = None
        if model is not None and set(model.modalities) - {"text"}:
            # No output cap and no text tokens: the row passed every check while
            # estimating; here its media are only counted, never refused again.
            self.context = JobContext(JobOptions(model=model.id, video_fps=job.video_fps),
                                      uncounted, None, kind_for(model))

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
