"""Chat rows through vLLM: a chunk's rows rendered once, then fed to the running engine.

Each row's prompt is rendered here with the checkpoint's own chat template and that row's
chat_template_kwargs (vLLM's LLM.chat takes one set of kwargs for a whole call, and rows
differ: thinking on or off, effort) by inference.chat_template.ChatTemplate.prompt, the
function the estimate counts with, and the chunk's prompts are encoded in one batch: the
template's scaffolding with the model's special tokens, the messages' text as text
(inference.tokens.ModelTokens.encode_prompts), so `<|im_end|>` or `</think>` in a message
is never the model's token. vLLM gets the ids (prompt_token_ids) and tokenizes nothing. The
rows then join the engine's running batch through its feed (feed.py), beside the rows of
the worker's other chunks. A row the engine refuses fails alone:
- its prompt leaves no room to answer in the context: refused before anything runs;
- its response_format cannot be compiled into a grammar (vLLM refuses it as the request is
  added): that request alone is refused, every other row still runs.

Media rows (issue 41; docs/dev/decisions/2026-12-06-media-checkpoints-and-frames-as-images.md):
a row's media parts arrive decoded by the worker (inference.engines.media, never a URL). Each
is rendered by the same template as the part transformers' multimodal templates print their
placeholder for ({"type": "image"}, "audio", "video"), so the placeholder is scaffolding and a
message's own "<image>" stays text; vLLM gets the ids and the decoded values beside them
(multi_modal_data), and its processor expands each placeholder into the model's media
tokens. A clip on a model that reads no video itself goes as its sampled frames, one picture
each. What the media took (ChatOutcome.media_tokens) is the expanded prompt less the same
messages' prompt without them.

Thinking (output-format.txt): the checkpoint's template opens the trace of a thinking row
(Qwen3's `<think>`, read off the template's own text, never off a message), so everything
generated until `</think>` is reasoning and goes to `reasoning`; what follows is `content`.
The reasoning budget closes a trace that reaches it with a notice (budget.py). A
response_format is enforced by vLLM's structured outputs from the end of the trace on: with
a reasoning parser configured, vLLM 0.32 starts the grammar only once the parser sees
`</think>` (in the prompt for a row whose thinking is off: the template's, as no message's
text is ever that token).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.chat_template import ChatPrompt
from inference.engines.feed import RequestFailed
from inference.engines.media import (
    DECODED_KEY,
    DecodedAudio,
    DecodedImage,
    DecodedVideo,
    MediaLimits,
)
from inference.engines.runtime import feed_of, llm_load
from inference.engines.thinking import thinking_args
from inference.engines.types import (
    ChatOutcome,
    ChatRow,
    ChatSettings,
    FinishReason,
    RowError,
    RowRefused,
)
from inference.response_format import json_schema_satisfied, response_format_problem
from inference.tokens import checkpoint_tokens

logger = logging.getLogger(__name__)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
# The trace's last line when the budget closes it (output-format.txt: "a short notice that
# the budget is exhausted and the model is answering with what it has").
BUDGET_NOTICE = "Thinking budget exhausted: answering now with what I have."


@dataclass(frozen=True)
class _Rendered:
    """A row's prompt; where it carries media, the same messages' prompt without them (what
    its media added is the difference) and the decoded media in the order their
    placeholders appear, as vLLM's multi_modal_data."""

    prompt: ChatPrompt
    text_only: ChatPrompt | None = None
    media: dict[str, list[Any]] | None = None


@dataclass(frozen=True)
class _Prepared:
    index: int
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    thinking: bool
    response_format: dict[str, Any] | None
    media: dict[str, list[Any]] | None = None
    text_tokens: int | None = None  # the prompt's tokens without its media, where it has any

    @property
    def request(self) -> dict[str, Any]:
        """The engine's request: token ids, and the row's decoded media beside them."""
        if self.media is None:
            return {"prompt_token_ids": self.prompt}
        return {"prompt_token_ids": self.prompt, "multi_modal_data": self.media}


class ChatEngine:
    def __init__(self, *, model_id: str, checkpoint: Path, context_tokens: int,
                 reasoning: bool, media: MediaLimits | None = None,
                 media_context_tokens: int | None = None) -> None:
        self.model_id = model_id
        self.checkpoint = checkpoint
        # A row carrying media may have a larger context than a text row (the catalog's
        # media_context_tokens): the engine is built for the larger.
        loaded = llm_load(checkpoint, runner="generate",
                          max_model_len=max(context_tokens, media_context_tokens or 0),
                          reasoning_parser="qwen3" if reasoning else None, media=media)
        # What a row may carry beside text: the catalog's media, each read by the model
        # itself or, a clip on a model that reads no video, as its frames (pictures).
        self.media = media
        self.native = loaded.native
        self.llm = loaded.llm
        self.lock = loaded.lock
        self.load_seconds = loaded.seconds
        self.feed = feed_of(loaded)
        self.tokenizer = self.llm.get_tokenizer()
        # The template and tokenizer the estimate counts with (inference/tokens.py): a row's
        # prompt is rendered and encoded by nothing else.
        tokens = checkpoint_tokens(checkpoint.resolve())
        if tokens is None or tokens.template is None:
            raise RuntimeError(f"checkpoint {checkpoint} has no tokenizer.json and chat "
                               "template: its rows could be neither counted nor encoded")
        self.tokens = tokens
        self.template = tokens.template
        # The context a row is served in: the catalog's, within what the engine was built
        # with (it may be shared with another model id on the same checkpoint).
        built = int(self.llm.model_config.max_model_len)
        self.context_tokens = min(context_tokens, built)
        self.media_context_tokens = min(media_context_tokens or context_tokens, built)
        self.open_id = self._single_token(THINK_OPEN) if reasoning else None
        self.close_id = self._single_token(THINK_CLOSE) if reasoning else None
        self.notice_ids: list[int] = []
        if self.close_id is not None:
            # Ends on </think> itself: a grammar that starts there takes the next token.
            self.notice_ids = self._encode(f"\n\n{BUDGET_NOTICE}\n{THINK_CLOSE}")

    @property
    def budget_notice_tokens(self) -> int:
        """Output tokens the budget notice adds to a trace it closes (</think> included)."""
        return len(self.notice_ids)

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _single_token(self, text: str) -> int | None:
        ids = self._encode(text)
        return ids[0] if len(ids) == 1 else None

    # -- the chunk --------------------------------------------------------------------------

    def generate(self, rows: list[ChatRow], settings: ChatSettings) -> list[ChatOutcome]:
        """Every row rendered once, its prompt encoded in one batch with the chunk's others,
        then all of them through the engine's feed beside whatever else is running."""
        outcomes: list[ChatOutcome | None] = [None] * len(rows)
        renders: list[_Rendered] = []
        rendered: list[int] = []
        for index, row in enumerate(rows):
            try:
                renders.append(self._render(row))
            except RowRefused as refused:
                outcomes[index] = ChatOutcome.failed(refused.error)
                continue
            rendered.append(index)
        # One batch: every prompt, then the media rows' prompts without their media.
        bare = [render.text_only for render in renders if render.text_only is not None]
        encoded = self.tokens.encode_prompts([render.prompt for render in renders] + bare)
        bare_counts = iter(map(len, encoded[len(renders):]))
        prepared: list[_Prepared] = []
        shared: dict[int, Any] = {}  # rows with the same plain settings share their params
        for index, render, ids in zip(rendered, renders, encoded[:len(renders)], strict=True):
            text_tokens = None if render.text_only is None else next(bare_counts)
            try:
                prepared.append(self._prepare(index, rows[index], render, ids, settings,
                                              shared, text_tokens))
            except RowRefused as refused:
                outcomes[index] = ChatOutcome.failed(refused.error)
        refusals = _refusal_types()
        results = self.feed.run([item.request for item in prepared],
                                [item.params for item in prepared])
        for item, result in zip(prepared, results, strict=True):
            if isinstance(result, RequestFailed):  # the engine failed on this row alone
                outcomes[item.index] = ChatOutcome.failed(RowError.engine_failed())
            elif isinstance(result, refusals):
                outcomes[item.index] = ChatOutcome.failed(_refusal(result))
            elif isinstance(result, Exception):
                raise result  # not the row's fault: the chunk fails and is retried
            else:
                outcomes[item.index] = self._outcome(item, result)
        assert all(outcome is not None for outcome in outcomes)
        return [outcome for outcome in outcomes if outcome is not None]

    # -- one row ----------------------------------------------------------------------------

    def _prepare(self, index: int, row: ChatRow, render: _Rendered, prompt: list[int],
                 settings: ChatSettings, shared: dict[int, Any],
                 text_tokens: int | None) -> _Prepared:
        from vllm import SamplingParams

        rendered = render.prompt

        # A media row's placeholders are expanded by the engine's processor, past this
        # count: the engine stops its answer at the context's end (finish_reason length).
        context = self.context_tokens if render.media is None else self.media_context_tokens
        room = context - len(prompt)
        if room < 1:
            raise RowRefused(RowError.invalid_request(
                f"This row's prompt is {len(prompt):,} tokens, which leaves no room for "
                f"output in the {context:,}-token context of model "
                f"'{self.model_id}'. Shorten or split this row.",
                code="context_length_exceeded", param="messages"))
        thinking = self._opens_trace(rendered)
        response_format = _structured(row.response_format)
        extra_args = None
        if thinking and settings.reasoning_budget and self.open_id is not None \
                and self.close_id is not None:
            extra_args = thinking_args(budget=settings.reasoning_budget, open_id=self.open_id,
                                       close_id=self.close_id, notice_ids=self.notice_ids)
        # The job's cap, within what is left of the context once the prompt is in it.
        max_tokens = min(settings.max_tokens, room)
        plain = response_format is None and extra_args is None
        params = shared.get(max_tokens) if plain else None
        if params is None:
            # detokenize=False: the outcome decodes the ids itself (reasoning is split from
            # content by token), so the engine's step loop need not build text as well.
            params = SamplingParams(
                max_tokens=max_tokens, temperature=settings.temperature, seed=settings.seed,
                structured_outputs=_structured_params(response_format), extra_args=extra_args,
                detokenize=False)
            if plain:
                shared[max_tokens] = params
        return _Prepared(index=index, prompt=prompt, params=params, thinking=thinking,
                         response_format=response_format, media=render.media,
                         text_tokens=text_tokens)

    def _render(self, row: ChatRow) -> _Rendered:
        """The row's prompt: the checkpoint's template under the row's kwargs, by the very
        function the estimate counts with (inference.chat_template.ChatTemplate.prompt),
        each media part in place as the template's own placeholder."""
        messages, text_only, media = self._media_messages(row)
        kwargs = row.chat_template_kwargs or {}
        try:
            if media is None:
                return _Rendered(self.template.prompt(messages, kwargs))
            return _Rendered(self.template.prompt(messages, kwargs),
                             self.template.prompt(text_only, kwargs), media)
        except Exception as error:
            raise RowRefused(RowError.invalid_request(
                f"The chat template of model '{self.model_id}' could not render this row's "
                f"messages: {error}", param="messages")) from error

    def _media_messages(self, row: ChatRow) -> tuple[list[dict[str, Any]],
                                                     list[dict[str, Any]],
                                                     dict[str, list[Any]] | None]:
        """The row's messages as the template takes media: each decoded part
        (inference.engines.media) replaced by `{"type": "image"}`, `{"type": "audio"}` or
        `{"type": "video"}` (transformers' multimodal templates print their placeholder
        for these, never a URL), a clip on a model that reads no video by one picture part
        per sampled frame; the same messages without their media; and the decoded values
        in the order their parts appear (vLLM pairs them with the placeholders in that
        order), None where the row has none. A part this model cannot read fails its row
        rather than being dropped from the prompt unseen."""
        media: dict[str, list[Any]] = {}
        messages: list[dict[str, Any]] = []
        text_only: list[dict[str, Any]] = []
        for at, message in enumerate(row.messages):
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                messages.append(message)
                text_only.append(message)
                continue
            parts: list[Any] = []
            texts: list[Any] = []
            for position, part in enumerate(content):
                kind = part.get("type") if isinstance(part, dict) else None
                if kind == "text":
                    parts.append(part)
                    texts.append(part)
                    continue
                decoded = part.get(DECODED_KEY) if isinstance(part, dict) else None
                placed = self._media_part(decoded, media)
                if placed is None:
                    taken = ", ".join(["text", *self._modalities()])
                    raise RowRefused(RowError.invalid_request(
                        f"model '{self.model_id}' reads {taken}; this row carries a "
                        f"{kind!r} content part it cannot read",
                        param=f"messages[{at}].content[{position}]"))
                parts += placed
            messages.append({**message, "content": parts})
            text_only.append({**message, "content": texts})
        return messages, text_only, (media or None)

    def _modalities(self) -> list[str]:
        limits = self.media
        if limits is None:
            return []
        return [name for name, most in (("image", limits.images), ("audio", limits.audios),
                                        ("video", limits.videos)) if most]

    def _media_part(self, decoded: object,
                    media: dict[str, list[Any]]) -> list[dict[str, str]] | None:
        """The template's parts for one decoded media value, its data added to `media`;
        None where this model takes no such media."""
        taken = self._modalities()
        if isinstance(decoded, DecodedImage) and "image" in taken:
            media.setdefault("image", []).append(decoded.image)
            return [{"type": "image"}]
        if isinstance(decoded, DecodedAudio) and "audio" in taken:
            media.setdefault("audio", []).append((decoded.samples, decoded.rate))
            return [{"type": "audio"}]
        if isinstance(decoded, DecodedVideo) and "video" in taken:
            if "video" in self.native:
                media.setdefault("video", []).append(_video_item(decoded))
                return [{"type": "video"}]
            # No video in this model: the sampled frames, each a picture
            # (docs/dev/decisions/2026-12-06-media-checkpoints-and-frames-as-images.md).
            media.setdefault("image", []).extend(decoded.frames)
            return [{"type": "image"} for _ in decoded.frames]
        return None

    def _opens_trace(self, prompt: ChatPrompt) -> bool:
        """The template left a trace open: the row thinks (chat_template_kwargs decided).
        Read off the template's own text (both markers are single tokens of the
        checkpoint there), never off a message's, which is text and opens nothing."""
        if self.open_id is None:
            return False
        return prompt.opens_trace(THINK_OPEN, THINK_CLOSE)

    def _outcome(self, item: _Prepared, output: Any) -> ChatOutcome:
        completion = output.outputs[0]
        ids = list(completion.token_ids)
        reasoning: str | None = None
        content: str | None
        reasoning_tokens = 0
        if item.thinking:
            if self.close_id in ids:
                end = ids.index(self.close_id)
                reasoning = self._decode(ids[:end]).strip("\n")
                # A repeated </think> after the trace closed is dropped, as vLLM's qwen3
                # parser drops it: it is markup, not answer.
                content = self._decode([t for t in ids[end + 1:]
                                        if t != self.close_id]).lstrip("\n")
                reasoning_tokens = end + 1
            else:  # the cap (or an end of turn) came inside the trace: no answer
                reasoning = self._decode(ids).strip("\n")
                content = None
                reasoning_tokens = len(ids)
        else:
            content = self._decode(ids)
        finish_reason: FinishReason = "length" if completion.finish_reason == "length" \
            else "stop"
        # A media row's prompt as the engine read it: its placeholders expanded by the
        # model's processor (vLLM's prompt_token_ids), of which its media took all but the
        # tokens of the same messages without them.
        prompt_tokens = len(item.prompt)
        media_tokens = None
        if item.text_tokens is not None:
            prompt_tokens = len(output.prompt_token_ids or item.prompt)
            media_tokens = max(prompt_tokens - item.text_tokens, 0)
        # What vLLM's prefix cache held of the prompt when the row was first scheduled
        # (None on an engine that does not count it): never more than the prompt.
        cached_tokens = min(int(getattr(output, "num_cached_tokens", None) or 0),
                            prompt_tokens)
        return ChatOutcome(
            content=content, reasoning=reasoning, finish_reason=finish_reason,
            prompt_tokens=prompt_tokens, completion_tokens=len(ids),
            reasoning_tokens=reasoning_tokens,
            format_error=item.response_format is not None
            and not _satisfies(content, item.response_format),
            media_tokens=media_tokens, cached_tokens=cached_tokens,
        )

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


def _video_item(video: DecodedVideo) -> tuple[Any, dict[str, Any]]:
    """A clip for a model that reads video itself: its frames as sampled here, with the
    metadata vLLM's video processors take for frames already sampled (no sampling of their
    own)."""
    import numpy as np

    frames = np.stack([np.asarray(frame) for frame in video.frames])
    count = len(video.frames)
    return frames, {"total_num_frames": count, "fps": video.fps, "duration": video.seconds,
                    "video_backend": "anex", "frames_indices": list(range(count)),
                    "do_sample_frames": False}


def _structured(response_format: dict[str, Any] | None) -> dict[str, Any] | None:
    """The row's response_format when it constrains the answer; "text" is none."""
    if not response_format or response_format.get("type") == "text":
        return None
    # The submit and row checks refuse these already; a row that reached the engine some
    # other way is refused here too, before xgrammar compiles its schema
    # (docs/dev/decisions/2026-12-01-customer-json-schemas.md).
    problem = response_format_problem(response_format)
    if problem:
        raise RowRefused(RowError.invalid_request(problem, param="response_format"))
    return response_format


def _structured_params(response_format: dict[str, Any] | None) -> Any:
    if response_format is None:
        return None
    from vllm.sampling_params import StructuredOutputsParams

    if response_format["type"] == "json_object":
        return StructuredOutputsParams(json_object=True)
    return StructuredOutputsParams(json=response_format["json_schema"]["schema"])


def _satisfies(content: str | None, response_format: dict[str, Any]) -> bool:
    """Generation is constrained, yet an answer cut by the cap, or a schema feature the
    grammar does not enforce, can still leave content that is not what was asked for.

    The schema is the customer's: it is evaluated without retrieving anything and with RE2
    patterns (inference.response_format), and whatever it raises makes this row a format error,
    never the chunk's failure."""
    if content is None:
        return False
    try:
        value = json.loads(content)
        if response_format["type"] == "json_object":
            return isinstance(value, dict)
        return json_schema_satisfied(value, response_format["json_schema"]["schema"])
    except Exception as error:  # any failure of the check is the row's, not the chunk's
        logger.info("response_format check failed on a row: %s", type(error).__name__)
        return False


def _refusal_types() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request it will not take (a 4xx), as opposed to a failure of
    the engine itself, which must fail the chunk and be retried elsewhere."""
    from vllm.exceptions import VLLMClientError

    return (VLLMClientError, ValueError, TypeError)


def _refusal(error: Exception) -> RowError:
    # The engine's message may quote the row: it goes to the row's error, not the logs.
    logger.info("chat row refused by the engine: %s", type(error).__name__)
    param = getattr(error, "parameter", None)
    message = str(error).strip() or type(error).__name__
    if "grammar" in message or "schema" in message:
        param = "response_format"
    return RowError.invalid_request(message, param=param if isinstance(param, str) else None)
