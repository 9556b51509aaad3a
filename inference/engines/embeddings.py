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

Media rows (issue 41, on a VL embedding checkpoint: qwen3-vl-embedding, tiny-vl-embedding):
a row whose input is a list of text, image_url and video_url parts is read as the reference
says ("How embedding inputs are processed"): one user turn under the published default
system turn, the prompt ending after that turn (inference.rows.embeddings'
MEDIA_ROW_PREFIX and MEDIA_ROW_SUFFIX, which the row checks count), each picture and clip
at its place among the texts (inference.engines.placeholders), the pictures and frames the
product decoded handed to vLLM beside the prompt, never a URL. The prompt's frame is the
model's special tokens; a text part is its characters only (`<image>` written in a row is
text, never a placeholder). Text rows are read as before, so a text row's vector is the
realtime query's on the same model and width, and a media row's shares their space: one
model, one pooling, one cut and normalisation. A media row's media_tokens are what its
media took of the prompt once vLLM expanded its placeholders.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference.engines.forward import FORWARD
from inference.engines.media import DECODED_KEY, DecodedImage, DecodedVideo
from inference.engines.placeholders import Placeholders, placeholders_of
from inference.engines.runtime import llm_load
from inference.engines.types import EmbedOutcome, EmbedRow, RowError
from inference.rows.embeddings import MEDIA_ROW_PREFIX, MEDIA_ROW_SUFFIX
from inference.tokens import ModelTokens, checkpoint_tokens

END_OF_TEXT = "<|endoftext|>"


@dataclass(frozen=True)
class MediaCaps:
    """The most media one row may carry (the row checks' caps and the catalog's clip
    ceiling), which sizes the engine: pictures, clips, and frames in a clip."""

    images: int = 0
    clips: int = 0
    frames: int = 0

    def limits(self, placeholders: Placeholders) -> dict[str, int]:
        """vLLM's limit_mm_per_prompt: a clip is a video where the family takes video,
        else its frames are pictures."""
        if placeholders.native_video:
            return {"image": self.images, "video": self.clips}
        return {"image": self.images + self.clips * self.frames}


@dataclass
class _MediaPrompt:
    """A media row's prompt ids (its placeholders unexpanded), the decoded media vLLM
    expands them with, and how many of the ids are placeholders."""

    ids: list[int]
    images: list[Any] = field(default_factory=list)
    videos: list[Any] = field(default_factory=list)
    placeholder_tokens: int = 0

    def request(self) -> dict[str, Any]:
        data: dict[str, Any] = {}
        if self.images:
            data["image"] = self.images
        if self.videos:
            data["video"] = self.videos
        return {"prompt_token_ids": self.ids, "multi_modal_data": data}


class EmbeddingEngine:
    def __init__(self, *, model_id: str, checkpoint: Path, context_tokens: int,
                 dimensions_native: int | None, dimensions_min: int | None,
                 media: MediaCaps | None = None) -> None:
        self.model_id = model_id
        self.checkpoint = checkpoint
        # Media rows need a VL family's placeholders and the tokenizer to frame them with;
        # a model sold for text (or a checkpoint of no VL family) refuses them.
        self.tokens = checkpoint_tokens(checkpoint.resolve())
        self.placeholders = placeholders_of(checkpoint.resolve()) \
            if media is not None and (media.images or media.clips) \
            and self.tokens is not None else None
        limits = media.limits(self.placeholders) \
            if media is not None and self.placeholders is not None else None
        loaded = llm_load(checkpoint, runner="pooling", max_model_len=context_tokens,
                          limit_mm_per_prompt=limits)
        self.llm = loaded.llm
        self.lock = loaded.lock
        self.load_seconds = loaded.seconds
        self.tokenizer = self.llm.get_tokenizer()
        self.context_tokens = min(context_tokens, int(self.llm.model_config.max_model_len))
        self.dimensions_native = dimensions_native or int(self.llm.model_config.embedding_size)
        self.dimensions_min = dimensions_min or 1
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
        texts: list[int] = []
        media: dict[int, _MediaPrompt] = {}
        for index, row in enumerate(rows):
            error = self._refusal(row)
            if error is None and isinstance(row.text, list):
                prompt = self._media_prompt(row.text)
                if isinstance(prompt, RowError):
                    error = prompt
                else:
                    media[index] = prompt
            elif error is None:
                texts.append(index)
            if error is not None:
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0, error=error)
        requests: dict[int, dict[str, Any]] = {}
        for index, ids in zip(texts, self._tokens([str(rows[i].text) for i in texts]),
                              strict=True):
            if len(ids) > self.context_tokens:
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0,
                                               error=_too_long(len(ids), self))
                continue
            requests[index] = {"prompt_token_ids": ids}
        for index, prompt in media.items():
            # Unexpanded, the prompt is shorter than the model reads; vLLM refuses what is
            # still too long once expanded (a failed run, retried row by row: _run).
            if len(prompt.ids) > self.context_tokens:
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0,
                                               error=_too_long(len(prompt.ids), self))
                continue
            requests[index] = prompt.request()
        order = sorted(requests)  # row order: a chunk's rows reach vLLM as they came
        for index, result in zip(order, self._run([requests[i] for i in order],
                                                  [rows[i].dimensions for i in order]),
                                 strict=True):
            if isinstance(result, RowError):
                outcomes[index] = EmbedOutcome(vector=None, prompt_tokens=0, error=result)
                continue
            vector, read = result
            prompt_media = media.get(index)
            outcomes[index] = EmbedOutcome(
                vector=vector, prompt_tokens=read,
                media_tokens=None if prompt_media is None
                else read - (len(prompt_media.ids) - prompt_media.placeholder_tokens))
        return [outcome for outcome in outcomes if outcome is not None]

    def _run(self, requests: list[dict[str, Any]],
             widths: list[int | None]) -> list[tuple[list[float], int] | RowError]:
        """The rows' vectors and the tokens each prompt came to, from one engine run. A
        media row vLLM refuses (too long once its media are expanded, media it cannot
        read) fails that run: the rows are then run one at a time, so it fails alone."""
        if not requests:
            return []
        try:
            return list(self._pooled(requests, widths))
        except Exception:
            if not any("multi_modal_data" in request for request in requests):
                raise  # text rows were checked before: an engine failure, the chunk's
        results: list[tuple[list[float], int] | RowError] = []
        for request, width in zip(requests, widths, strict=True):
            try:
                results.extend(self._pooled([request], [width]))
            except Exception as error:  # the row's own failure, reported in its row
                if "multi_modal_data" not in request:
                    raise
                results.append(_media_refusal(error, self))
        return results

    def _pooled(self, requests: list[dict[str, Any]],
                widths: list[int | None]) -> list[tuple[list[float], int]]:
        """One engine run; each pooled state cut to its row's width, then made unit length
        (unnormalised from the engine: truncating a unit vector would leave it short);
        with the tokens each prompt came to (a media row's placeholders expanded)."""
        import torch
        from vllm.pooling_params import PoolingParams

        with self.lock, FORWARD:  # its own engine's turn, then the process's forward pass
            results = self.llm.encode(requests,
                                      pooling_params=PoolingParams(use_activation=False),
                                      pooling_task="embed", use_tqdm=False)
        read = [len(result.prompt_token_ids) if result.prompt_token_ids is not None
                else len(request["prompt_token_ids"])
                for result, request in zip(results, requests, strict=True)]
        states = torch.stack([result.outputs.data for result in results]).to(torch.float64)
        if len(set(widths)) == 1:  # the common chunk: one width, cut and scaled at once
            vectors = _unit_rows(states, widths[0])
        else:
            vectors = [_unit_rows(state.unsqueeze(0), width)[0]
                       for state, width in zip(states, widths, strict=True)]
        return list(zip(vectors, read, strict=True))

    def _media_prompt(self, parts: list[Any]) -> _MediaPrompt | RowError:
        """A content-part row as the reference reads it: the default system turn, then one
        user turn of the parts in order, each picture and clip at its placeholder."""
        tokens, placeholders = self.tokens, self.placeholders
        assert tokens is not None and placeholders is not None  # _refusal saw to it
        prefix, suffix, image, video = tokens.encode_batch(
            [MEDIA_ROW_PREFIX, MEDIA_ROW_SUFFIX, placeholders.image, placeholders.video or ""])
        prompt = _MediaPrompt(ids=list(prefix))
        text: list[str] = []  # adjacent text parts, read as one text (as the rows count it)
        for index, part in enumerate(parts):
            if part.get("type") == "text":
                text.append(str(part.get("text") or ""))
                continue
            prompt.ids += _content_ids(tokens, text)
            text = []
            decoded = part.get(DECODED_KEY)
            if isinstance(decoded, DecodedImage):
                prompt.ids += image
                prompt.images.append(decoded.image)
                prompt.placeholder_tokens += len(image)
            elif isinstance(decoded, DecodedVideo) and placeholders.native_video:
                prompt.ids += video
                prompt.videos.append(_video_item(decoded))
                prompt.placeholder_tokens += len(video)
            elif isinstance(decoded, DecodedVideo):
                for frame in decoded.frames:
                    prompt.ids += image
                    prompt.images.append(frame)
                    prompt.placeholder_tokens += len(image)
            else:
                # The worker decodes every media part before a chunk reaches the engine;
                # one it did not is never read from its URL here.
                return RowError.invalid_request(
                    f"input[{index}] holds no decoded media: the part was not brought and "
                    "decoded before the model read it.", param=f"input[{index}]")
        prompt.ids += _content_ids(tokens, text) + list(suffix)
        return prompt

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
        if isinstance(row.text, list) and self.placeholders is None:
            # A model served for text never embeds the list's Python text.
            return RowError.invalid_request(
                f"This row's input is a list of content parts (images, video or text parts): "
                f"model '{self.model_id}' is served for text only. Send the input as a "
                "single string.", param="input")
        if isinstance(row.text, list):
            if not row.text or not all(isinstance(part, dict) for part in row.text):
                return RowError.invalid_request(
                    "embeddings input must be a non-empty string or a list of content parts",
                    param="input")
        elif not isinstance(row.text, str) or not row.text:
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


def _content_ids(tokens: ModelTokens, texts: list[str]) -> list[int]:
    """A row's text as its characters (the tokenizer without its added tokens)."""
    joined = "".join(texts)
    if not joined:
        return []
    return list(tokens.content_tokenizer.encode(joined, add_special_tokens=False).ids)


def _video_item(video: DecodedVideo) -> tuple[Any, dict[str, Any]]:
    """A clip as a family that reads video takes it: its frames already sampled (vLLM
    samples none again), with their times for the model's timestamps."""
    import numpy as np

    frames = np.stack([np.asarray(frame.convert("RGB")) for frame in video.frames])
    return frames, {"fps": video.fps, "duration": video.seconds,
                    "total_num_frames": len(video.frames),
                    "frames_indices": list(range(len(video.frames))),
                    "video_backend": "opencv", "do_sample_frames": False}


def _too_long(tokens: int, engine: EmbeddingEngine) -> RowError:
    return RowError.invalid_request(
        f"This row is {tokens:,} tokens, over the {engine.context_tokens:,}-token context of "
        f"model '{engine.model_id}'. Shorten or split this row.",
        code="context_length_exceeded", param="input")


def _media_refusal(error: Exception, engine: EmbeddingEngine) -> RowError:
    """What a media row vLLM refused alone reads: over the context once its media were
    expanded, else media the model could not read (an engine failure)."""
    text = str(error)
    if "longer than the maximum model length" in text or "max_model_len" in text:
        return RowError.invalid_request(
            f"This row's text and media are over the {engine.context_tokens:,}-token "
            f"context of model '{engine.model_id}'. Send fewer or shorter media, or "
            "split this row.", code="context_length_exceeded", param="input")
    return RowError.engine_failed(param="input")
