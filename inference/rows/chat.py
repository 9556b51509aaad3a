"""Chat rows (/v1/chat/completions): messages and their content parts, the per-row thinking
setting and effort level, a per-row response_format, and whether the row fits the model.

From a body only messages, chat_template_kwargs and response_format are carried (the
reference's "The input file"); a model, max_completion_tokens or any other field on the line
is ignored, not refused.
"""

from __future__ import annotations

from inference.response_format import response_format_problem
from inference.rows.core import (
    ZERO,
    Counted,
    JobContext,
    RowCost,
    RowRef,
    fit_check,
    listing,
)
from inference.rows.media import Media, parts_check, row_context

ROLES = ("system", "developer", "user", "assistant", "tool")
_ROLE_SET = frozenset(ROLES)
# The one response_format with nothing to check (every row of a JSON-mode file has it).
_PLAIN_JSON = {"type": "json_object"}
# The chat template wraps every message in a few tokens of its own (ChatML: <|im_start|>,
# the role, a newline, <|im_end|>, a newline). A text row is counted exactly, as the prompt
# the engine renders from the checkpoint's template (JobContext.chat_prompt); where that
# cannot be done (no template here, media in the row) 4 tokens per message approximate it.
MESSAGE_TEMPLATE_TOKENS = 4
_MODALITY_ORDER = ("image", "audio", "video")
# The settings a row may make through chat_template_kwargs (the reference's "The input
# file"). Every other key would reach the model's chat template as a variable of its own,
# where bos_token, eos_token or add_generation_prompt redraw the prompt's special tokens:
# refused, naming the row, rather than rendered.
ROW_TEMPLATE_KWARGS = ("enable_thinking", "reasoning_effort")


def chat_row(body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
    own = body.get("chat_template_kwargs")
    thinking, effort = row_thinking(own, job=job, row=row)
    response_format = body.get("response_format")
    if response_format is not None and response_format != _PLAIN_JSON:
        response_format_check(response_format, row=row)
    kwargs = template_kwargs(own, reasoning=job.options.reasoning,
                             effort=job.options.reasoning_effort) if job.renders_chat else None
    cost = chat_cost(body.get("messages"), job=job, row=row, kwargs=kwargs)
    cost.thinking, cost.effort = thinking, effort
    cost.own_response_format = response_format is not None
    return cost


def job_thinking(job: JobContext) -> tuple[bool, str | None]:
    """A row that says nothing about thinking (every parquet row): the job's setting, else
    the model's default (thinking on for a reasoning model)."""
    return _effective(None, None, job)


def template_kwargs(own: object, *, reasoning: bool | None,
                    effort: str | None) -> dict[str, object]:
    """The chat_template_kwargs a row is rendered with: its own thinking switch and effort
    (only ROW_TEMPLATE_KWARGS), the job's filling in only what the row leaves unsaid. The
    engine request (inference.kinds.chat) and the count (chat_cost) both take them from
    here."""
    kwargs = {key: value for key, value in own.items() if key in ROW_TEMPLATE_KWARGS} \
        if isinstance(own, dict) else {}
    if "enable_thinking" not in kwargs and reasoning is not None:
        kwargs["enable_thinking"] = reasoning
    if "reasoning_effort" not in kwargs and effort:
        kwargs["reasoning_effort"] = effort
    return kwargs


def chat_cost(messages: object, *, job: JobContext, row: RowRef,
              kwargs: dict[str, object] | None = None) -> RowCost:
    """The row's input tokens (text and media), checked against the model's context. A
    text-only row is counted as the prompt the engine renders under `kwargs` (its
    template kwargs, template_kwargs()) where the checkpoint's template is at hand."""
    if not isinstance(messages, list) or not messages:
        raise row.reject("messages must be a non-empty list of messages")
    media: list[Media] = []
    texts: list[str] = []
    text_tokens = 0
    for position, message in enumerate(messages):
        if type(message) is dict:  # the common message first: a role and a string
            content = message.get("content")
            if type(content) is str and message.get("role") in _ROLE_SET \
                    and "tool_calls" not in message:
                text_tokens += MESSAGE_TEMPLATE_TOKENS
                texts.append(content)
                continue
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise row.reject(f"{where} must be an object with a role and content")
        role = message.get("role")
        if role not in ROLES:
            raise row.reject(f"{where}.role must be one of {', '.join(ROLES)}")
        content = message.get("content")
        text_tokens += MESSAGE_TEMPLATE_TOKENS
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            parts = parts_check(content, job=job, row=row, where=f"{where}.content")
            if parts.texts:
                texts.append("".join(parts.texts))
            media.extend(parts.media)
        elif content is not None or role != "assistant":
            # Only an assistant turn may leave content null (one that made tool calls).
            raise row.reject(f"{where}.content must be a string or a list of content parts")
        texts.extend(_tool_call_texts(message.get("tool_calls")))
    short = job.unmeasured_chars
    for text in texts:
        if len(text) > short:
            job.length_check(text)  # a string too long for any context is refused unread
    counted: list[Counted] = [*texts]
    if not media:
        prompt = job.chat_prompt(messages, kwargs or {})
        if prompt is not None:  # exact: the engine's own prompt, template tokens and all
            if prompt.chars > short:
                job.length_check(prompt.text)
            counted, text_tokens = [prompt], 0
        if job.deferring:  # counted with the file's next batch (CountBatch)
            return RowCost(text_tokens=text_tokens, context_limit=job.model.context_tokens,
                           uncounted=counted)
    text_tokens += sum(job.count_batch(counted)) if counted else 0
    return row_fitted(text_tokens, media, job=job, row=row)


def _tool_call_texts(tool_calls: object) -> list[str]:
    # An earlier assistant turn's tool calls are rendered into the prompt, so they are read.
    if not isinstance(tool_calls, list):
        return []
    texts = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                value = function.get(key)
                if isinstance(value, str):
                    texts.append(value)
    return texts


def row_fitted(text_tokens: int, media: list[Media], *, job: JobContext,
               row: RowRef) -> RowCost:
    """A row's tokens against its context (the reference's "Models": input tokens including
    what the media encodes to, and input plus output when the job caps output)."""
    model = job.model
    if media:
        modalities = {m.modality for m in media}
        media_tokens = sum(m.tokens for m in media)
        limit = row_context(job, modalities)
    else:  # the common row: text only, checked without building anything
        modalities, media_tokens, limit = set(), 0, model.context_tokens
    fit_check(text_tokens + media_tokens, limit,
              [m for m in _MODALITY_ORDER if m in modalities], job=job, row=row)
    if not media:
        return RowCost(text_tokens=text_tokens, context_limit=limit)
    clips = [m for m in media if m.seconds is not None]
    return RowCost(
        text_tokens=text_tokens, media_tokens=media_tokens,
        images=sum(1 for m in media if m.modality == "image"), clips=len(clips),
        media_seconds=sum((m.seconds for m in clips if m.seconds is not None),
                          start=ZERO),
        estimated_clips=sum(1 for m in clips if m.estimated), context_limit=limit,
    )


def row_thinking(kwargs: object, *, job: JobContext, row: RowRef) -> tuple[bool, str | None]:
    """The row's chat_template_kwargs: its own thinking switch and effort level, checked
    against the model and the job (the reference's reasoning, reasoning_budget and
    reasoning_effort rules that reach rows). Any other key is left alone, as the reference
    says, and never reaches the template either: only these two are read from the row
    (inference.kinds.chat.chat_kwargs), so a row cannot hand the template a token."""
    if kwargs is None:
        return _effective(None, None, job)
    if not isinstance(kwargs, dict):
        raise row.reject("chat_template_kwargs must be an object")
    model, options = job.model, job.options
    enable = kwargs.get("enable_thinking")
    if enable is not None and not isinstance(enable, bool):
        raise row.reject("chat_template_kwargs.enable_thinking must be true or false")
    if enable is True and not model.reasoning:
        raise row.reject(f"chat_template_kwargs.enable_thinking is true, but model "
                         f"'{model.id}' produces no reasoning trace; drop the setting or "
                         "choose a reasoning model")
    if enable is False and options.reasoning_budget:
        raise row.reject(
            f"chat_template_kwargs.enable_thinking is false, but the job sets "
            f"reasoning_budget {options.reasoning_budget}, which needs thinking on; remove "
            "the row's setting or submit the job without a reasoning_budget"
        )
    effort = kwargs.get("reasoning_effort")
    if effort is not None:
        if not model.effort_levels:
            raise row.reject(f"chat_template_kwargs.reasoning_effort: model '{model.id}' "
                             "has no thinking effort levels")
        if effort not in model.effort_levels:
            raise row.reject(
                f"chat_template_kwargs.reasoning_effort {_quoted(effort)} is not a level of "
                f"model '{model.id}', which takes {listing(model.effort_levels, 'or')} "
                "(case-sensitive)"
            )
    thinking, level = _effective(enable, effort, job)
    if effort is not None and not thinking:
        why = "the row" if enable is False else "the job (reasoning: false)"
        raise row.reject(f"chat_template_kwargs.reasoning_effort needs thinking on, but "
                         f"{why} turns it off")
    return thinking, level


def _effective(enable: bool | None, effort: object, job: JobContext) -> tuple[bool, str | None]:
    model, options = job.model, job.options
    if not model.reasoning:
        return False, None
    if enable is not None:
        thinking = enable
    elif options.reasoning is not None:
        thinking = options.reasoning
    else:
        thinking = True  # a reasoning model thinks unless told not to
    if not thinking or not model.effort_levels:
        return thinking, None
    level = effort if isinstance(effort, str) else options.reasoning_effort
    return True, level or model.default_effort


def response_format_check(value: object, *, row: RowRef) -> None:
    """The same structural check as a job-level response_format (inference.response_format)."""
    problem = response_format_problem(value)
    if problem:
        raise row.reject(problem)

def _quoted(value: object) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)

