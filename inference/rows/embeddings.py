"""Embedding rows (/v1/embeddings): a single non-empty string, or on the VL embedding models
a list of text, image_url and video_url parts; an optional per-row dimensions; nothing else
the reference refuses (messages, a non-float encoding_format, audio)."""

from __future__ import annotations

from inference.rows.chat import row_fitted
from inference.rows.core import JobContext, RowCost, RowRef
from inference.rows.media import MODALITY_OF, no_encoder, parts_check

EMBED_PART_TYPES = ("text", "image_url", "video_url")
_AUDIO_PARTS = ("input_audio", "audio_url")
SINGLE_STRING = ("embeddings input must be a single string per row, not a list (submit one "
                 "row per input)")
# The reference ("How embedding inputs are processed"): a content-part row is sent as one
# user message through the model's chat template, whose default system turn is published,
# and the prompt ends after the user turn. Counting that text keeps the count exact.
MEDIA_ROW_PREFIX = ("<|im_start|>system\nRepresent the user's input.<|im_end|>\n"
                    "<|im_start|>user\n")
MEDIA_ROW_SUFFIX = "<|im_end|>\n"
# A string row has one end-of-text token appended before it is pooled (same section).
END_OF_TEXT_TOKENS = 1


def embedding_row(body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
    if "messages" in body:
        raise row.reject("an embeddings request carries 'input', not 'messages'")
    encoding = body.get("encoding_format")
    if encoding is not None and encoding != "float":
        raise row.reject(f"encoding_format must be \"float\", not {encoding!r}; vectors are "
                         "returned as floats")
    dimensions = body.get("dimensions")
    if dimensions is not None:
        dimensions_check(dimensions, job=job, row=row)
    return embedding_input(body.get("input"), job=job, row=row)


def dimensions_check(value: object, *, job: JobContext, row: RowRef) -> None:
    model = job.model
    floor, native = model.dimensions_min, model.dimensions_native
    if floor is None or native is None:
        raise row.reject(f"model '{model.id}' does not take dimensions")
    if isinstance(value, bool) or not isinstance(value, int) or not floor <= value <= native:
        raise row.reject(f"dimensions must be a whole number from {floor} to {native} on "
                         f"model '{model.id}', not {value!r}")


def embedding_input(value: object, *, job: JobContext, row: RowRef) -> RowCost:
    """One row's input: its tokens, on the text-only or the media-row rate."""
    if isinstance(value, str):
        if not value:
            raise row.reject("embeddings input must be a non-empty string")
        if job.deferring:  # counted with the file's next batch (CountBatch)
            job.length_check(value)
            return RowCost(text_tokens=END_OF_TEXT_TOKENS, uncounted=[value])
        cost = row_fitted(job.count_tokens(value) + END_OF_TEXT_TOKENS, [], job=job, row=row)
        cost.context_limit = None  # nothing is generated: no output to leave room for
        return cost
    if not isinstance(value, list):
        if value is None:
            raise row.reject("an embeddings request needs 'input': a single non-empty string")
        raise row.reject("embeddings input must be a single non-empty string")
    if not all(isinstance(part, dict) for part in value):
        raise row.reject(SINGLE_STRING)
    model = job.model
    if not {"image", "video"} & set(model.modalities):
        # A text-only model takes a string; a media part is refused by its modality first.
        for part in value:
            modality = MODALITY_OF.get(str(part.get("type")))
            if modality == "audio":
                raise row.reject(_no_audio(job))
            if modality is not None:
                raise row.reject(no_encoder(job, modality))
        raise row.reject(SINGLE_STRING)
    parts = parts_check(value, job=job, row=row, where="input", types=EMBED_PART_TYPES,
                        refused=dict.fromkeys(_AUDIO_PARTS, _no_audio(job)))
    if not parts.media and not any(parts.texts):
        raise row.reject("embeddings input needs at least one part with media or "
                         "non-empty text")
    text = MEDIA_ROW_PREFIX + "".join(parts.texts) + MEDIA_ROW_SUFFIX
    cost = row_fitted(job.count_tokens(text), parts.media, job=job, row=row)
    cost.context_limit = None
    # The reference prices a row "carrying any media (images, video, or both)" at the media
    # rate; a list of text parts alone stays a text-only row.
    cost.media_row = bool(parts.media)
    return cost


def _no_audio(job: JobContext) -> str:
    return (f"model '{job.model.id}' has no encoder for audio input: no embedding model "
            "takes audio")
