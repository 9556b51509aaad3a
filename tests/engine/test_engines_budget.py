"""The thinking-budget processor's bookkeeping, token by token (the engine tests run it for
real; here every case on chosen tokens, those the local model never produces included: a
trace it opens itself, rows moving in vLLM's batch)."""

from __future__ import annotations

import pytest
import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from inference.engines.budget import ThinkingBudgetProcessor
from inference.engines.thinking import thinking_args

OPEN, CLOSE = 90, 91
NOTICE = [70, 71, CLOSE]
VOCAB = 100


def params(budget: int) -> SamplingParams:
    return SamplingParams(extra_args=thinking_args(budget=budget, open_id=OPEN,
                                                   close_id=CLOSE, notice_ids=NOTICE))


def processor() -> ThinkingBudgetProcessor:
    return ThinkingBudgetProcessor(None, torch.device("cpu"), False)  # type: ignore[arg-type]


def add(proc: ThinkingBudgetProcessor, *rows: tuple[int, SamplingParams, list[int],
                                                    list[int]]) -> None:
    proc.update_state(BatchUpdate(batch_size=len(rows), removed=[], added=list(rows), moved=[]))


def step(proc: ThinkingBudgetProcessor, outputs: list[list[int]], sampled: list[int],
         rows: int) -> list[int | None]:
    """One decoding step: what each row was forced to (None: free), then its token lands."""
    logits = proc.apply(torch.zeros(rows, VOCAB))
    forced: list[int | None] = []
    for index in range(rows):
        finite = torch.isfinite(logits[index]).nonzero().flatten().tolist()
        forced.append(finite[0] if len(finite) == 1 else None)
        token = forced[index]
        outputs[index].append(sampled[index] if token is None else token)
    proc.update_state(None)
    return forced


def test_a_trace_reaching_its_budget_is_closed_by_the_notice() -> None:
    proc, output = processor(), list[int]()
    add(proc, (0, params(3), [1, OPEN], output))
    forced = [step(proc, [output], [5], 1)[0] for _ in range(8)]
    assert forced == [None, None, None, 70, 71, CLOSE, None, None]
    assert output == [5, 5, 5, *NOTICE, 5, 5]


def test_a_trace_the_model_closes_itself_is_left_alone() -> None:
    proc, output = processor(), list[int]()
    add(proc, (0, params(4), [1, OPEN], output))
    sampled = [5, CLOSE, 6, 6, 6, 6, 6]
    forced = [step(proc, [output], [token], 1)[0] for token in sampled]
    assert forced == [None] * len(sampled)
    assert output == sampled  # no notice forced into the answer afterwards


def test_a_trace_the_model_opens_itself_is_counted_from_there() -> None:
    proc, output = processor(), list[int]()
    add(proc, (0, params(2), [1, 2], output))  # the prompt opened no trace
    sampled = [7, 7, OPEN, 8, 8, 8, 8, 8, 8]
    forced = [step(proc, [output], [token], 1)[0] for token in sampled]
    assert forced == [None, None, None, None, None, 70, 71, CLOSE, None]


def test_a_prompt_whose_trace_is_closed_needs_no_budget() -> None:
    proc, output = processor(), list[int]()
    add(proc, (0, params(1), [1, OPEN, CLOSE, 3], output))
    assert [step(proc, [output], [5], 1)[0] for _ in range(4)] == [None] * 4


def test_rows_without_a_budget_and_moved_rows() -> None:
    proc = processor()
    budgeted: list[int] = []
    free: list[int] = []
    add(proc, (0, SamplingParams(), [1, OPEN], free), (1, params(1), [1, OPEN], budgeted))
    outputs = [free, budgeted]
    assert step(proc, outputs, [5, 5], 2) == [None, None]
    # vLLM swaps the two rows in its batch: the budget follows its row.
    proc.update_state(BatchUpdate(batch_size=2, removed=[], added=[],
                                  moved=[(0, 1, MoveDirectionality.SWAP)]))
    outputs = [budgeted, free]
    assert step(proc, outputs, [5, 5], 2) == [70, None]


@pytest.mark.parametrize("args", [{"budget": -1, "notice": NOTICE, "close": CLOSE},
                                  {"budget": 3, "notice": [70], "close": CLOSE}])
def test_malformed_arguments_are_refused(args: dict[str, object]) -> None:
    with pytest.raises(ValueError, match="anex_thinking"):
        ThinkingBudgetProcessor.validate_params(SamplingParams(
            extra_args={"anex_thinking": args}))
