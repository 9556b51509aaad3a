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
class _Prepared:
    index: int
    prompt: list[int]
    params: Any  # vllm.SamplingParams
    thinking: bool
    response_format: dict[str, Any] | None


class ChatEngine:
    def __init__(self, *, model_id: str, checkpoint: Path, context_tokens: int,
                 reasoning: bool) -> None:
        self.model_id = model_id
        self.checkpoint = checkpoint
        loaded = llm_load(checkpoint, runner="generate", max_model_len=context_tokens,
                          reasoning_parser="qwen3" if reasoning else None)
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
        self.context_tokens = min(context_tokens, int(self.llm.model_config.max_model_len))
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
        prompts: list[ChatPrompt] = []
        rendered: list[int] = []
        for index, row in enumerate(rows):
            try:
                prompts.append(self._render(row))
            except RowRefused as refused:
                outcomes[index] = ChatOutcome.failed(refused.error)
                continue
            rendered.append(index)
        prepared: list[_Prepared] = []
        shared: dict[int, Any] = {}  # rows with the same plain settings share their params
        for index, prompt, ids in zip(rendered, prompts, self.tokens.encode_prompts(prompts),
                                      strict=True):
            try:
                prepared.append(self._prepare(index, rows[index], prompt, ids, settings,
                                              shared))
            except RowRefused as refused:
                outcomes[index] = ChatOutcome.failed(refused.error)
        refusals = _refusal_types()
        results = self.feed.run([{"prompt_token_ids": item.prompt} for item in prepared],
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

    def _prepare(self, index: int, row: ChatRow, rendered: ChatPrompt, prompt: list[int],
                 settings: ChatSettings, shared: dict[int, Any]) -> _Prepared:
        from vllm import SamplingParams

        room = self.context_tokens - len(prompt)
        if room < 1:
            raise RowRefused(RowError.invalid_request(
                f"This row's prompt is {len(prompt):,} tokens, which leaves no room for "
                f"output in the {self.context_tokens:,}-token context of model "
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
                         response_format=response_format)

    def _check_parts(self, row: ChatRow) -> None:
        """This engine renders text: a content part it cannot read fails its row rather
        than being dropped from the prompt unseen."""
        for message in row.messages:
            content = message.get("content") if isinstance(message, dict) else None
            if not isinstance(content, list):
                continue
            for part in content:
                kind = part.get("type") if isinstance(part, dict) else None
                if kind != "text":
                    raise RowRefused(RowError.invalid_request(
                        f"model '{self.model_id}' reads text only; this row carries a "
                        f"{kind!r} content part", param="messages"))

    def _render(self, row: ChatRow) -> ChatPrompt:
        """The row's prompt: the checkpoint's template under the row's kwargs, by the very
        function the estimate counts with (inference.chat_template.ChatTemplate.prompt)."""
        self._check_parts(row)
        try:
            return self.template.prompt(row.messages, row.chat_template_kwargs or {})
        except Exception as error:
            raise RowRefused(RowError.invalid_request(
                f"The chat template of model '{self.model_id}' could not render this row's "
                f"messages: {error}", param="messages")) from error

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
        return ChatOutcome(
            content=content, reasoning=reasoning, finish_reason=finish_reason,
            prompt_tokens=len(item.prompt), completion_tokens=len(ids),
            reasoning_tokens=reasoning_tokens,
            format_error=item.response_format is not None
            and not _satisfies(content, item.response_format),
        )

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))


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
