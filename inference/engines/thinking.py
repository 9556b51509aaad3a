"""How a row asks the thinking-budget processor (budget.py) to watch it: a plain dict in
SamplingParams.extra_args, so that building a row's parameters needs no vLLM import."""

from __future__ import annotations

from typing import Any

EXTRA_ARG = "anex_thinking"


def thinking_args(*, budget: int, open_id: int, close_id: int,
                  notice_ids: list[int]) -> dict[str, Any]:
    """SamplingParams.extra_args for a row with a thinking budget. notice_ids is the forced
    close: the notice's tokens ending with </think> (close_id)."""
    return {EXTRA_ARG: {"budget": budget, "open": open_id, "close": close_id,
                        "notice": notice_ids}}
