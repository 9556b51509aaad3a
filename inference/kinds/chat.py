"""Chat rows (/v1/chat/completions): generated text under the job's output cap, thinking
and response_format, each row free to set its own thinking, effort and response_format.

The row checks themselves are inference.rows.chat (messages, content parts, media); this
kind says when they apply, and what a checked row becomes when it is served.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from inference.constants import RowOutcome
from inference.engines import ChatOutcome, ChatRow, ChatSettings
from inference.engines.chat import ChatEngine
from inference.engines.media import MediaLimits
from inference.kinds.base import ParquetReading, ServedJob, ServedRow, TaskKind
from inference.kinds.media import PartPath
from inference.pricing import Usage, usd
from inference.rows.chat import chat_cost, chat_row, job_thinking, template_kwargs
from inference.rows.core import CHAT, InputRejected, JobContext, JobOptions, RowCost, RowRef
from inference.rows.fast import ChatFastRows
from inference.rows.media import MODALITY_OF

if TYPE_CHECKING:
    from pathlib import Path

    from inference.catalog import CatalogModel
    from inference.kinds.base import InputRow
    from inference.kinds.metering import RowMeter
    from inference.rows.core import FileReport

# Thinking needs room to close before the answer (the reference: "at least 64 below an
# explicit max_output_tokens").
BUDGET_HEADROOM = 64
PROMPT, MESSAGES = "prompt", "messages"  # a parquet input's content columns
FORMAT_ERROR = {"message": "The output does not satisfy the row's response_format.",
                "type": "format_error", "code": None, "param": "response_format"}


@runtime_checkable
class ChatRunner(Protocol):
    """What a chat kind calls: inference.engines.ChatEngine."""

    def generate(self, rows: list[ChatRow], settings: ChatSettings) -> list[ChatOutcome]: ...


# -- the engine request --------------------------------------------------------------------

def chat_kwargs(job: ServedJob, body: dict[str, Any]) -> dict[str, Any]:
    """The row's chat_template_kwargs, the job's thinking setting and effort filling in
    only what the row leaves unsaid. Only the keys a row may set reach the template
    (inference.rows.chat.ROW_TEMPLATE_KWARGS): never a special token of its own."""
    return template_kwargs(body.get("chat_template_kwargs"), reasoning=job.reasoning,
                           effort=job.reasoning_effort or None)


def row_response_format(job: ServedJob, body: dict[str, Any]) -> dict[str, Any] | None:
    """A row's own response_format replaces the job's whole (all or nothing)."""
    own = body.get("response_format")
    return own if own is not None else job.response_format


def _job_kwargs(job: JobContext) -> dict[str, object]:
    """A parquet row's template kwargs: the job's alone (parquet rows carry no settings)."""
    return template_kwargs(None, reasoning=job.options.reasoning,
                           effort=job.options.reasoning_effort)


# -- the result body -----------------------------------------------------------------------

def completion_body(job: ServedJob, row: InputRow, *, content: str | None, reasoning: str | None,
                    finish_reason: str, prompt_tokens: int, completion_tokens: int,
                    reasoning_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """The chat completion object, as an OpenAI-compatible server returns it; its usage's
    prompt_tokens_details.cached_tokens is OpenAI's: the part of prompt_tokens the engine
    did not compute (billed at the input rate all the same)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning"] = reasoning  # the trace, never mixed into content
    return {
        "id": f"chatcmpl-{job.pk.hex[:12]}-{row.index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": job.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens,
                  "prompt_tokens_details": {"cached_tokens": cached_tokens},
                  "completion_tokens_details": {"reasoning_tokens": reasoning_tokens}},
    }


# -- parquet rows --------------------------------------------------------------------------

class ChatParquet(ParquetReading):
    """A `prompt` column (text, one user turn) or a `messages` column (JSON text, or a
    native list of message structs); thinking as the job sets it."""

    def content_column(self, columns: Collection[str]) -> str:
        if MESSAGES in columns:
            return MESSAGES
        if PROMPT in columns:
            return PROMPT
        raise InputRejected("A parquet input for a chat model needs a 'prompt' column "
                            "(text) or a 'messages' column (JSON text).")

    def row_cost(self, column: str, value: Any, *, job: JobContext, row: RowRef) -> RowCost:
        if column == PROMPT:
            if not isinstance(value, str) or not value:
                raise row.reject("prompt is empty")
            cost = chat_cost([{"role": "user", "content": value}], job=job, row=row,
                             kwargs=_job_kwargs(job))
        else:
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except (ValueError, RecursionError):
                    raise row.reject("messages is not valid JSON: it must be a JSON list of "
                                     "messages") from None
            cost = chat_cost(value, job=job, row=row, kwargs=_job_kwargs(job))
        cost.thinking, cost.effort = job_thinking(job)
        return cost

    def body(self, column: str, value: Any) -> dict[str, Any]:
        if column == PROMPT:
            return {"messages": [{"role": "user", "content": value}]}
        return {"messages": json.loads(value) if isinstance(value, str) else value}


# -- the kind ------------------------------------------------------------------------------

class ChatKind(TaskKind[ChatRow, ChatOutcome, ChatRunner]):
    runner = ChatRunner
    runner_noun = "a chat engine"
    task = "chat"
    endpoint = CHAT
    noun = "a chat model"
    generates = True
    parquet: ClassVar[ParquetReading | None] = ChatParquet()
    tokens_per_second = 2_000

    def fields_problem(self, model: CatalogModel, options: JobOptions) -> str | None:
        if options.given("dimensions"):
            return (f"dimensions is for embedding models; '{model.id}' is a chat-completions "
                    "model.")
        if options.reasoning is True and not model.reasoning:
            return f"reasoning cannot be true on '{model.id}': it produces no reasoning trace."
        budget = options.reasoning_budget
        if budget:  # 0 means "no cap" and is accepted on any generation model
            if not model.reasoning:
                return (f"reasoning_budget cannot be set on '{model.id}': it produces no "
                        "reasoning trace (0 is accepted).")
            if options.reasoning is False:
                return ("reasoning_budget needs thinking on: a budget of 1 or more with "
                        "reasoning false is refused.")
            cap = options.max_output_tokens
            if cap is not None and budget > cap - BUDGET_HEADROOM:
                return (f"reasoning_budget must be at least {BUDGET_HEADROOM} below "
                        f"max_output_tokens ({cap}); got {budget}.")
        effort = options.reasoning_effort
        if effort is not None:
            if not model.effort_levels:
                return (f"reasoning_effort cannot be set on '{model.id}': it has no thinking "
                        "effort levels.")
            if effort not in model.effort_levels:
                return (f"reasoning_effort must be one of {', '.join(model.effort_levels)} on "
                        f"'{model.id}' (case-sensitive); got '{effort}'.")
            if options.reasoning is False:
                return "reasoning_effort cannot be set with reasoning false."
        fps = options.video_fps
        if fps is not None:
            ceiling = model.media.video_fps_max
            if ceiling is None:
                return f"model '{model.id}' does not support video_fps"
            if fps > ceiling:
                return f"video_fps {fps:g} is above the {ceiling} fps ceiling of {model.id}"
        return None

    def needs_sample(self, model: CatalogModel, options: JobOptions) -> bool:
        """The reference: the output cap is estimated from a sample when omitted, and on a
        reasoning model the sample still sets the thinking budget unless one was given or
        reasoning is off."""
        if options.max_output_tokens is None:
            return True
        return model.reasoning and options.reasoning is not False \
            and options.reasoning_budget is None

    def row_cost(self, body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
        return chat_row(body, job=job, row=row)

    def fast_rows(self, job: JobContext) -> ChatFastRows:
        return ChatFastRows(job)

    def takes_job_video_fps(self, model: CatalogModel) -> bool:
        # gemma4-12b takes no rate: a job-level video_fps counts only under a ceiling.
        return model.media.video_fps_max is not None

    def estimate_usage(self, model: CatalogModel, report: FileReport, *,
                       max_output_tokens: int | None) -> Usage:
        """The counted rows plus every row's output at the job's cap, which has to fit the
        room the longest row leaves in the context."""
        output_per_row = max_output_tokens or 0
        if report.output_headroom is not None and output_per_row > report.output_headroom:
            raise InputRejected(
                f"max_output_tokens {output_per_row:,} does not fit: the longest row leaves "
                f"{report.output_headroom:,} tokens of '{model.id}''s context for the output. "
                "Lower max_output_tokens, or shorten or split the longest rows.")
        return report.usage + Usage(output_tokens=output_per_row * report.rows)

    def engine_build(self, model: CatalogModel, checkpoint: Path) -> ChatEngine:
        return ChatEngine(model_id=model.id, checkpoint=checkpoint,
                          context_tokens=model.context_tokens, reasoning=model.reasoning,
                          media=MediaLimits.of(model),
                          media_context_tokens=model.media_context_tokens)


    def media_paths(self, body: dict[str, Any]) -> list[PartPath]:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return []
        return [("messages", i, "content", j) for i, message in enumerate(messages)
                if isinstance(message, dict) and isinstance(message.get("content"), list)
                for j, part in enumerate(message["content"])
                if isinstance(part, dict) and part.get("type") in MODALITY_OF]

    def engine_request(self, job: ServedJob, body: dict[str, Any]) -> ChatRow:
        return ChatRow(messages=body.get("messages") or [],
                       chat_template_kwargs=chat_kwargs(job, body),
                       response_format=row_response_format(job, body))

    def merge_key(self, job: ServedJob, body: dict[str, Any]) -> bytes | None:
        """A row that asked for sampling (a temperature above 0 without a seed) is never
        merged: anex serves batch chat greedy and applies no row's temperature today
        (docs/openai.md), but such a row asked for an answer of its own. Any temperature
        that is not a number reads as a request to sample."""
        temperature = body.get("temperature")
        greedy = temperature is None or (isinstance(temperature, int | float)
                                         and not isinstance(temperature, bool)
                                         and temperature <= 0)
        if not greedy and body.get("seed") is None:
            return None
        return super().merge_key(job, body)

    def copied(self, outcome: ChatOutcome) -> ChatOutcome:
        """A copy computed none of its prompt: all of it is cached."""
        if outcome.error is not None:
            return outcome
        return dataclasses.replace(outcome, cached_tokens=outcome.prompt_tokens)

    def engine_run(self, job: ServedJob, requests: list[ChatRow]) -> list[ChatOutcome]:
        return self.engine(job.model).generate(
            requests, ChatSettings(max_tokens=job.max_output_tokens or 1,
                                   reasoning_budget=job.reasoning_budget or None))

    def served(self, job: ServedJob, row: InputRow, outcome: ChatOutcome,
               meter: RowMeter) -> ServedRow:
        if outcome.error is not None:
            return ServedRow.failed(outcome.error)
        usage = meter.chat(row.body, prompt_tokens=outcome.prompt_tokens,
                           completion_tokens=outcome.completion_tokens,
                           engine_media=outcome.media_tokens,
                           cached_tokens=outcome.cached_tokens)
        # The prompt the row is billed for: its media at the catalog's fixed tokens (its
        # cached tokens held within it by the meter).
        body = completion_body(job, row, content=outcome.content, reasoning=outcome.reasoning,
                               finish_reason=outcome.finish_reason,
                               prompt_tokens=usage.input_tokens + usage.media_tokens,
                               completion_tokens=outcome.completion_tokens,
                               reasoning_tokens=outcome.reasoning_tokens,
                               cached_tokens=usage.cached_input_tokens)
        result = (RowOutcome.FORMAT_ERROR if outcome.format_error else
                  RowOutcome.TRUNCATED if outcome.finish_reason == "length" else
                  RowOutcome.SUCCESS)
        return ServedRow(
            outcome=result, status_code=200, body=body,
            error=FORMAT_ERROR if outcome.format_error else None, output=outcome.content,
            usage=usage)

    def pricing_section(self, models: list[CatalogModel]) -> list[str]:
        lines = [
            "## Chat models",
            "",
            "| Model | Input (per 1M tokens) | Media input (per 1M tokens) "
            "| Output (per 1M tokens) | Per audio/video clip "
            "| Audio/video surcharge (per minute) | Minimum job |",
            "| --- | --- | --- | --- | --- | --- | --- |",
        ]
        for m in models:
            p = m.price
            lines.append(
                f"| `{m.id}` | {usd(p.input_per_mtok)} | {usd(p.media_input_rate)} "
                f"| {usd(p.output_per_mtok)} | {usd(p.per_clip)} | {usd(p.per_media_minute)} "
                f"| {usd(p.minimum_job)} |"
            )
        lines += [
            "",
            "Images, audio and video become input tokens at the media input rate (a clip costs",
            "tokens per frame x (seconds x rate, rounded up, + 1)); each clip adds the flat",
            "per-clip charge and the per-minute surcharge on its duration.",
        ]
        return lines
