"""Chat rows through vLLM: the whole chunk in one engine run.

Each row's prompt is rendered here with the checkpoint's own chat template and that row's
chat_template_kwargs (vLLM's LLM.chat takes one set of kwargs for a whole call, and rows
differ: thinking on or off, effort), then every row goes to one LLM.generate. A row the
engine refuses fails alone:
- its prompt leaves no room to answer in the context: refused before anything runs;
- its response_format cannot be compiled into a grammar (vLLM refuses it as the request is
  added): the run is retried with that row left out, every other row still in one run.

Thinking (output-format.txt): the checkpoint's template opens the trace of a thinking row
(Qwen3's `<think>`), so everything generated until `</think>` is reasoning and goes to
`reasoning`; what follows is `content`. The reasoning budget closes a trace that reaches it
with a notice (budget.py). A response_format is enforced by vLLM's structured outputs from
the end of the trace on: with a reasoning parser configured, vLLM 0.32 starts the grammar
only once the parser sees `</think>` (in the prompt for a row whose thinking is off).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference.engines.runtime import llm_load
from inference.engines.thinking import thinking_args
from inference.engines.types import (
    ChatOutcome,
    ChatRow,
    ChatSettings,
    FinishReason,
    RowError,
    RowRefused,
)
from jobs.response_format import json_schema_satisfied, response_format_problem

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
        self.tokenizer = self.llm.get_tokenizer()
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
        outcomes: list[ChatOutcome | None] = [None] * len(rows)
        prepared: list[_Prepared] = []
        for index, row in enumerate(rows):
            try:
                prepared.append(self._prepare(index, row, settings))
            except RowRefused as refused:
                outcomes[index] = ChatOutcome.failed(refused.error)
        with self.lock:
            ran = self._run(prepared, outcomes)
        for item, output in ran:
            outcomes[item.index] = self._outcome(item, output)
        assert all(outcome is not None for outcome in outcomes)
        return [outcome for outcome in outcomes if outcome is not None]

    def _run(self, prepared: list[_Prepared],
             outcomes: list[ChatOutcome | None]) -> list[tuple[_Prepared, Any]]:
        """One engine run for every prepared row. vLLM refuses a bad request as it is
        added and drops the whole call; then the refused rows are found one by one (adding
        is cheap, nothing has run) and the rest run together."""
        if not prepared:
            return []
        refusals = _refusal_types()
        prompts = [{"prompt_token_ids": item.prompt} for item in prepared]
        try:
            results = self.llm.generate(prompts, [item.params for item in prepared],
                                        use_tqdm=False)
            return list(zip(prepared, results, strict=True))
        except refusals as error:
            if len(prepared) == 1:
                outcomes[prepared[0].index] = ChatOutcome.failed(_refusal(error))
                return []
        accepted: list[_Prepared] = []
        request_ids: list[str] = []
        for item in prepared:
            try:
                [request_id] = self.llm.enqueue(
                    [{"prompt_token_ids": item.prompt}], [item.params], use_tqdm=False)
            except refusals as error:
                outcomes[item.index] = ChatOutcome.failed(_refusal(error))
                continue
            accepted.append(item)
            request_ids.append(request_id)
        if not accepted:
            return []
        by_id = {output.request_id: output
                 for output in self.llm.wait_for_completion(use_tqdm=False)}
        # enqueue answers vLLM's internal id, "<our id>-<8 random characters>"; an output
        # carries ours.
        return [(item, by_id[request_id.rsplit("-", 1)[0]])
                for item, request_id in zip(accepted, request_ids, strict=True)]

    # -- one row ----------------------------------------------------------------------------

    def _prepare(self, index: int, row: ChatRow, settings: ChatSettings) -> _Prepared:
        from vllm import SamplingParams

        prompt = self._render(row)
        room = self.context_tokens - len(prompt)
        if room < 1:
            raise RowRefused(RowError.invalid_request(
                f"This row's prompt is {len(prompt):,} tokens, which leaves no room for "
                f"output in the {self.context_tokens:,}-token context of model "
                f"'{self.model_id}'. Shorten or split this row.",
                code="context_length_exceeded", param="messages"))
        thinking = self._opens_trace(prompt)
        response_format = _structured(row.response_format)
        extra_args = None
        if thinking and settings.reasoning_budget and self.open_id is not None \
                and self.close_id is not None:
            extra_args = thinking_args(budget=settings.reasoning_budget, open_id=self.open_id,
                                       close_id=self.close_id, notice_ids=self.notice_ids)
        params = SamplingParams(
            # The job's cap, within what is left of the context once the prompt is in it.
            max_tokens=min(settings.max_tokens, room),
            temperature=settings.temperature,
            seed=settings.seed,
            structured_outputs=_structured_params(response_format),
            extra_args=extra_args,
        )
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

    def _render(self, row: ChatRow) -> list[int]:
        self._check_parts(row)
        # The row's kwargs reach the template; none may stand in for a rendering argument.
        kwargs = {key: value for key, value in (row.chat_template_kwargs or {}).items()
                  if key.isidentifier() and key not in _RENDERING_ARGUMENTS}
        try:
            text = self.tokenizer.apply_chat_template(
                row.messages, tokenize=False, add_generation_prompt=True, **kwargs)
        except Exception as error:
            raise RowRefused(RowError.invalid_request(
                f"The chat template of model '{self.model_id}' could not render this row's "
                f"messages: {error}", param="messages")) from error
        return self._encode(str(text))

    def _opens_trace(self, prompt: list[int]) -> bool:
        """The template left a trace open: the row thinks (chat_template_kwargs decided)."""
        if self.open_id is None:
            return False
        last_open = max((i for i, t in enumerate(prompt) if t == self.open_id), default=-1)
        last_close = max((i for i, t in enumerate(prompt) if t == self.close_id), default=-1)
        return last_open > last_close

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
    # other way is refused here too, before xgrammar compiles its schema (docs/decisions.md,
    # "Customer JSON schemas").
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
    patterns (jobs.response_format), and whatever it raises makes this row a format error,
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


_RENDERING_ARGUMENTS = frozenset({
    "conversation", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs",
    "messages",
})


def _refusal_types() -> tuple[type[Exception], ...]:
    """What vLLM raises for a request it will not take (a 4xx), as opposed to a failure of
    the engine itself, which must fail the chunk and be retried elsewhere."""
    from vllm.exceptions import VLLMClientError

    return (VLLMClientError, ValueError, TypeError)


def _refusal(error: Exception) -> RowError:
    logger.info("chat row refused by the engine: %s", error)
    param = getattr(error, "parameter", None)
    message = str(error).strip() or type(error).__name__
    if "grammar" in message or "schema" in message:
        param = "response_format"
    return RowError.invalid_request(message, param=param if isinstance(param, str) else None)
