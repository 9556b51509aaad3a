"""Decision rows (/v1/systemone): typed questions about a text, answered in one pass with a
probability per option and no generated text; and the realtime API's decision requests,
whose body is a decision row's plus the model.

The row checks are inference.rows.decisions; the text a row is read as and the words a
question bills are inference.engines.decisions.state_text and question_text, the one
rendering the estimate, the engine and the realtime API all count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from inference.constants import InputFormat, RowOutcome
from inference.engines import DecisionOutcome, DecisionRow
from inference.engines.decisions import DecisionEngine
from inference.kinds.base import (
    GENERATION_FIELDS,
    RequestMalformed,
    RequestRefused,
    ServedJob,
    ServedRow,
    TaskKind,
    fields_refused,
    row_error_json,
)
from inference.pricing import Usage, usd
from inference.rows.core import DECISIONS, JobContext, JobOptions, RowCost, RowRef, RowRejected
from inference.rows.decisions import decision_row
from inference.tokens import token_counter, uncounted

if TYPE_CHECKING:
    from pathlib import Path

    from inference.catalog import CatalogModel
    from inference.engines.registry import Engine
    from inference.kinds.base import InputRow
    from inference.kinds.metering import RowMeter

# The catalog's option budget when a decision model states none (the reference: 192).
DEFAULT_OPTION_BUDGET = 192
# How a realtime refusal names what it refuses (a batch refusal names the row).
_REQUEST = RowRef("This request")


@runtime_checkable
class DecisionRunner(Protocol):
    """What a decision kind calls: inference.engines.DecisionEngine."""

    def decide(self, rows: list[DecisionRow]) -> list[DecisionOutcome]: ...


@dataclass(frozen=True)
class DecisionRequest:
    """One realtime decision body, checked: its engine row, and its input tokens as the
    estimate counts a batch row (the text once per question plus each question's words);
    None where this deployment has no tokenizer for the model. What the request bills is
    the engine's own count (DecisionOutcome.input_tokens)."""

    row: DecisionRow
    input_tokens: int | None

    def forward(self, model_id: str) -> dict[str, Any]:
        """The body sent to the model's realtime engine server (DecideKind.realtime_rows)."""
        return {"model": model_id, "state": self.row.state, "questions": self.row.questions,
                "lang": self.row.lang}


def answer_body(model_id: str, outcome: DecisionOutcome) -> dict[str, Any]:
    """The reference's decision response: one answer per question, routing and usage (a
    batch row's response body, and the realtime API's)."""
    return {"model": model_id, "answers": outcome.answers, "routing": outcome.routing,
            "usage": {"input_tokens": outcome.input_tokens, "output_tokens": 0}}


class DecideKind(TaskKind[DecisionRow, DecisionOutcome, DecisionRunner]):
    runner = DecisionRunner
    runner_noun = "a decision engine"
    task = "decide"
    endpoint = DECISIONS
    noun = "a decision model"
    realtime = True
    realtime_batch_rows = 32  # each up to 64 questions
    input_formats = (InputFormat.JSONL,)
    tokens_per_second = 100_000

    def fields_problem(self, model: CatalogModel, options: JobOptions) -> str | None:
        return fields_refused(options, (*GENERATION_FIELDS, "dimensions"),
                              f"the decision model '{model.id}': it answers typed questions "
                              "in one pass, with no generated text")

    def parquet_refusal(self, model: CatalogModel) -> str:
        return (f"Model '{model.id}' takes JSONL input only: a decision job's rows are JSONL "
                "lines with state and questions.")

    def row_cost(self, body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
        return decision_row(body, job=job, row=row)

    def text_token_bound(self, model: CatalogModel) -> int | None:
        # A decision row's text is cut to the context when served and counted whole, never
        # refused for its length (the reference's decision limits).
        return None

    def engine_build(self, model: CatalogModel, checkpoint: Path) -> DecisionEngine:
        return DecisionEngine(model_id=model.id, checkpoint=checkpoint,
                              context_tokens=model.context_tokens,
                              option_budget_tokens=model.option_budget_tokens
                              or DEFAULT_OPTION_BUDGET,
                              max_questions=model.max_questions)


    def engine_request(self, job: ServedJob, body: dict[str, Any]) -> DecisionRow:
        return DecisionRow(state=body["state"], questions=body.get("questions") or {},
                           lang=body.get("lang"))

    def engine_run(self, job: ServedJob, requests: list[DecisionRow]) -> list[DecisionOutcome]:
        return self.engine(job.model).decide(requests)

    def served(self, job: ServedJob, row: InputRow, outcome: DecisionOutcome,
               meter: RowMeter) -> ServedRow:
        if outcome.error is not None:
            return ServedRow.failed(outcome.error)
        return ServedRow(outcome=RowOutcome.SUCCESS, status_code=200,
                         body=answer_body(job.model, outcome),
                         output=json.dumps(outcome.answers),
                         usage=Usage(input_tokens=outcome.input_tokens))

    # -- the realtime API -------------------------------------------------------------------

    def realtime_request(self, model: CatalogModel, body: dict[str, object], *,
                         counted: bool = True) -> DecisionRequest:
        """One realtime decision body (state, questions, lang and model) checked by the
        batch row's rules, the reference's realtime limits among them (at most
        max_questions questions, a state of at most max_state_chars characters), then
        counted and turned into its engine row. RequestRefused (400) at the first
        violation past a limit, RequestMalformed (422) for the body's shape, worded as the
        row check words it ("This request: ...").

        What is wrong inside one question is the model's to refuse: the outcome then
        carries the model's own message (the reference answers it 422). `counted=False`
        skips the count (the web tier bills the engine's own; input_tokens is then None)."""
        count = token_counter(model.id) if counted else None
        context = JobContext(JobOptions(model=model.id), count or uncounted, None, self)
        try:
            cost = decision_row(body, job=context, row=_REQUEST)
        except RowRejected as rejected:
            refusal = RequestRefused if rejected.limit else RequestMalformed
            raise refusal(rejected.message) from None
        state, questions, lang = body["state"], body["questions"], body.get("lang")
        # decision_row passed them: a string or an object, a non-empty object, a string.
        assert isinstance(state, str | dict) and isinstance(questions, dict)
        return DecisionRequest(
            row=DecisionRow(state=state, questions=questions,
                            lang=lang if isinstance(lang, str) else None),
            input_tokens=cost.text_tokens if count is not None else None)

    def realtime_rows(self, body: dict[str, Any]) -> list[DecisionRow]:
        state, questions, lang = body.get("state"), body.get("questions"), body.get("lang")
        if not isinstance(state, str | dict) or not isinstance(questions, dict):
            raise ValueError("state (a string or an object) and questions (an object) are "
                             "needed")
        return [DecisionRow(state=state, questions=questions,
                            lang=lang if isinstance(lang, str) else None)]

    def realtime_run(self, engine: Engine, rows: list[DecisionRow]) -> list[dict[str, Any]]:
        """Per row its answers, the tokens it bills and its routing, or the model's refusal
        of a question (with the routing it was read by)."""
        assert isinstance(engine, DecisionRunner)
        return [{"error": row_error_json(out.error), "routing": out.routing}
                if out.error is not None
                else {"answers": out.answers, "input_tokens": out.input_tokens,
                      "routing": out.routing}
                for out in engine.decide(rows)]

    def realtime_reply(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        return results[0]  # a decision request is one row

    def pricing_section(self, models: list[CatalogModel]) -> list[str]:
        lines = [
            "## Decision model",
            "",
            "Input tokens only: the text is counted once per question, plus each question's own",
            "words. `est_output_tok` is always 0.",
            "",
            "| Model | Input (per 1M tokens) | Realtime (per 1M tokens) | Minimum job |",
            "| --- | --- | --- | --- |",
        ]
        for m in models:
            p = m.price
            lines.append(f"| `{m.id}` | {usd(p.input_per_mtok)} "
                         f"| {usd(p.realtime_input_per_mtok)} | {usd(p.minimum_job)} |")
        return lines
