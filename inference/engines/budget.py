"""The thinking budget, enforced while the row generates (output-format.txt, "Thinking").

A row whose thinking reaches its budget has its trace closed by us: the budget notice, then
</think>, are forced token by token, and the model answers after them as usual. The notice
and the forced tokens are ordinary output tokens (they count against max_tokens).

Why our own logits processor and not vLLM 0.32's `SamplingParams.thinking_token_budget`:
on the V1 model runner (the one CPU machines run) that feature recognises the end of
thinking only by the whole forced string, so with a notice in it a trace the model closes
itself with a bare </think> is not seen as closed, and the notice gets forced into the
answer. Here a natural </think> ends the count, and the notice is ours.

The processor sees a row only when its SamplingParams.extra_args carry `anex_thinking`
(thinking.py); every other row passes through untouched. It runs inside vLLM's
engine, so it must not import Django.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from inference.engines.thinking import EXTRA_ARG

if TYPE_CHECKING:
    from vllm import SamplingParams
    from vllm.config import VllmConfig


@dataclass
class _Row:
    budget: int
    open_id: int
    close_id: int
    notice: list[int]
    output: list[int]  # vLLM's live list of the row's generated tokens
    thinking: bool  # inside a trace right now
    closed: bool = False  # the trace ended (naturally or by the notice): nothing more to do
    counted: int = 0  # thinking tokens seen
    seen: int = 0  # how much of output has been read
    forcing: int = -1  # index into notice of the next token to force; -1: not forcing

    def advance(self) -> None:
        for token in self.output[self.seen:]:
            if self.forcing >= 0:
                self.forcing += 1
                if self.forcing >= len(self.notice):
                    self.forcing, self.thinking, self.closed = -1, False, True
            elif self.thinking:
                if token == self.close_id:
                    self.thinking, self.closed = False, True
                else:
                    self.counted += 1
            elif token == self.open_id:
                self.thinking = True
        self.seen = len(self.output)
        if self.thinking and self.forcing < 0 and self.counted >= self.budget:
            self.forcing = 0

    @property
    def forced_token(self) -> int | None:
        return self.notice[self.forcing] if self.forcing >= 0 else None


def _row(params: SamplingParams, prompt: list[int] | None, output: list[int]) -> _Row | None:
    args = (params.extra_args or {}).get(EXTRA_ARG)
    if not args:
        return None
    prompt = prompt or []
    open_id, close_id = int(args["open"]), int(args["close"])
    # In a trace from the start when the prompt opened one it did not close (the chat
    # template opens the trace of a thinking row).
    last_open = max((i for i, t in enumerate(prompt) if t == open_id), default=-1)
    last_close = max((i for i, t in enumerate(prompt) if t == close_id), default=-1)
    row = _Row(budget=int(args["budget"]), open_id=open_id, close_id=close_id,
               notice=[int(t) for t in args["notice"]], output=output,
               thinking=last_open > last_close)
    row.advance()
    return row


class ThinkingBudgetProcessor(LogitsProcessor):
    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        args = (sampling_params.extra_args or {}).get(EXTRA_ARG)
        if args is None:
            return
        budget, notice = args.get("budget"), args.get("notice")
        if not isinstance(budget, int) or budget < 0:
            raise ValueError(f"{EXTRA_ARG}.budget must be a whole number, not {budget!r}")
        if not isinstance(notice, list) or not notice or notice[-1] != args.get("close"):
            raise ValueError(f"{EXTRA_ARG}.notice must end with the close token")

    def __init__(self, vllm_config: VllmConfig, device: torch.device,
                 is_pin_memory: bool) -> None:
        self.rows: dict[int, _Row] = {}

    def is_argmax_invariant(self) -> bool:
        return False  # forcing a token changes what greedy decoding picks

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update:
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, prompt, output in batch_update.added:
                row = _row(params, prompt, output)
                if row is None:
                    self.rows.pop(index, None)
                else:
                    self.rows[index] = row
            for a, b, direction in batch_update.moved:
                first, second = self.rows.pop(a, None), self.rows.pop(b, None)
                if first is not None:
                    self.rows[b] = first
                if second is not None and direction == MoveDirectionality.SWAP:
                    self.rows[a] = second
        for index in [i for i, row in self.rows.items() if row.closed]:
            del self.rows[index]
        for row in self.rows.values():
            row.advance()

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, row in self.rows.items():
            token = row.forced_token
            if token is None or index >= logits.shape[0]:
                continue
            keep = logits[index, token].clone()
            logits[index].fill_(float("-inf"))
            # Any finite value: the forced token is then the only one that can be sampled.
            logits[index, token] = torch.where(torch.isfinite(keep), keep, 0.0)
        return logits
