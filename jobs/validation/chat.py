"""Chat rows (/v1/chat/completions): messages and their content parts, the per-row thinking
setting and effort level, a per-row response_format, and whether the row fits the model.

From a body only messages, chat_template_kwargs and response_format are carried (the
reference's "The input file"); a model, max_completion_tokens or any other field on the line
is ignored, not refused.
"""

from __future__ import annotations

from jobs.response_format import response_format_problem
from jobs.validation.core import ZERO, JobContext, RowCost, RowRef, listing, thousands
from jobs.validation.media import Media, parts_check, row_context

ROLES = ("system", "developer", "user", "assistant", "tool")
# The chat template wraps every message in a few tokens of its own (ChatML: <|im_start|>,
# the role, a newline, <|im_end|>, a newline). Rendering each model's template is the
# engine's job, not the checker's: 4 tokens per message approximates it, and the estimate
# is replaced by the served usage when the job runs.
MESSAGE_TEMPLATE_TOKENS = 4
_MODALITY_ORDER = ("image", "audio", "video")
# The settings a row may make through chat_template_kwargs (the reference's "The input
# file"). Every other key would reach the model's chat template as a variable of its own,
# where bos_token, eos_token or add_generation_prompt redraw the prompt's special tokens:
# refused, naming the row, rather than rendered.
ROW_TEMPLATE_KWARGS = ("enable_thinking", "reasoning_effort")


def chat_row(body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
    thinking, effort = _thinking(body.get("chat_template_kwargs"), job=job, row=row)
    response_format = body.get("response_format")
    if response_format is not None:
        response_format_check(response_format, row=row)
    cost = chat_cost(body.get("messages"), job=job, row=row)
    cost.thinking, cost.effort = thinking, effort
    cost.own_response_format = response_format is not None
    return cost


def job_thinking(job: JobContext) -> tuple[bool, str | None]:
    """A row that says nothing about thinking (every parquet row): the job's setting, else
    the model's default (thinking on for a reasoning model)."""
    return _effective(None, None, job)


def chat_cost(messages: object, *, job: JobContext, row: RowRef) -> RowCost:
    """The row's input tokens (text and media), checked against the model's context."""
    if not isinstance(messages, list) or not messages:
        raise row.reject("messages must be a non-empty list of messages")
    count = job.count_tokens
    text_tokens = 0
    media: list[Media] = []
    for position, message in enumerate(messages):
        where = f"messages[{position}]"
        if not isinstance(message, dict):
            raise row.reject(f"{where} must be an object with a role and content")
        role = message.get("role")
        if role not in ROLES:
            raise row.reject(f"{where}.role must be one of {', '.join(ROLES)}")
        content = message.get("content")
        text_tokens += MESSAGE_TEMPLATE_TOKENS
        if isinstance(content, str):
            text_tokens += count(content)
        elif isinstance(content, list):
            parts = parts_check(content, job=job, row=row, where=f"{where}.content")
            if parts.texts:
                text_tokens += count("".join(parts.texts))
            media.extend(parts.media)
        elif content is not None or role != "assistant":
            # Only an assistant turn may leave content null (one that made tool calls).
            raise row.reject(f"{where}.content must be a string or a list of content parts")
        text_tokens += _tool_call_tokens(message.get("tool_calls"), job)
    return row_fitted(text_tokens, media, job=job, row=row)


def _tool_call_tokens(tool_calls: object, job: JobContext) -> int:
    # An earlier assistant turn's tool calls are rendered into the prompt, so they are read.
    if not isinstance(tool_calls, list):
        return 0
    total = 0
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                value = function.get(key)
                if isinstance(value, str):
                    total += job.count_tokens(value)
    return total


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
    total = text_tokens + media_tokens
    if total > limit:
        carried = [m for m in _MODALITY_ORDER if m in modalities]
        serving = f" with {listing(carried)} input" if carried else ""
        including = " (including media)" if carried else ""
        raise row.reject_sentence(
            f"is too long: {thousands(total)} input tokens{including} exceeds the "
            f"{thousands(limit)}-token maximum that model '{model.id}' can serve{serving}. "
            "Shorten or split this row."
        )
    reserved = job.options.max_output_tokens
    if reserved and total + reserved > limit:
        # The reference: input and output together have to fit the context as well.
        raise row.reject_sentence(
            f"is too long: {thousands(total)} input tokens and the job's max_output_tokens "
            f"of {thousands(reserved)} come to {thousands(total + reserved)}, over the "
            f"{thousands(limit)}-token context of model '{model.id}'. Shorten or split this "
            "row, or lower max_output_tokens."
        )
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


def _thinking(kwargs: object, *, job: JobContext, row: RowRef) -> tuple[bool, str | None]:
    """The row's chat_template_kwargs: its own thinking switch and effort level, checked
    against the model and the job (the reference's reasoning, reasoning_budget and
    reasoning_effort rules that reach rows). Any other key is left alone, as the reference
    says, and never reaches the template either: only these two are read from the row
    (jobs.services.rows.chat_kwargs), so a row cannot hand the template a token."""
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
    """The same structural check as a job-level response_format (jobs.response_format)."""
    problem = response_format_problem(value)
    if problem:
        raise row.reject(problem)

def _quoted(value: object) -> str:
    return f"'{value}'" if isinstance(value, str) else repr(value)

