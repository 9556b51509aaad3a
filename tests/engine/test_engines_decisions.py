"""The decision engine (laya) on the real vLLM engine; the embedded default routes both
checkpoints to tiny-qwen3. A minute's training makes its probabilities little better than
a guess: the tests hold the reference's answer shape, the billing rule and the refusals."""

from __future__ import annotations

import math
from typing import Any

import pytest

from inference.engines import DecisionEngine, DecisionOutcome, DecisionRow
from inference.rows.decisions import question_text

# The reference's worked example ("Decision jobs", "Realtime decisions").
STATE = {"body": "We were billed twice for March. Please refund it today."}
QUESTIONS: dict[str, Any] = {
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "invoices, payments, refunds",
                          "technical": "bugs and outages", "other": "everything else"}},
    "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
    "frustration": {"type": "score", "instructions": "How frustrated is the customer?",
                    "criteria": ["calm", "annoyed", "angry"]},
}

pytest_plugins = ["tests.engine_fixtures"]


def answered(outcome: DecisionOutcome) -> dict[str, dict[str, Any]]:
    assert outcome.error is None, outcome.error
    assert outcome.answers is not None
    return outcome.answers


def unit_interval(value: object) -> bool:
    return isinstance(value, float) and 0.0 <= value <= 1.0


def test_every_question_type_is_answered_in_the_reference_shape(
        decision_engine: DecisionEngine) -> None:
    [outcome] = decision_engine.decide([DecisionRow(state=STATE, questions=QUESTIONS)])
    answers = answered(outcome)
    assert list(answers) == ["team", "urgent", "frustration"]

    team = answers["team"]
    assert set(team) == {"type", "choice", "probabilities", "confidence", "answer_confidence"}
    assert team["type"] == "choice"
    assert list(team["probabilities"]) == ["billing", "technical", "other"]
    assert math.fsum(team["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)
    assert team["choice"] == max(team["probabilities"], key=team["probabilities"].get)
    assert team["answer_confidence"] == team["probabilities"][team["choice"]]
    ranked = sorted(team["probabilities"].values(), reverse=True)
    assert team["confidence"] == pytest.approx(ranked[0] - ranked[1], abs=1e-3)

    urgent = answers["urgent"]
    assert set(urgent) == {"type", "noul", "confidence", "answer_confidence"}
    assert urgent["type"] == "noul" and unit_interval(urgent["noul"])
    # "on a yes-or-no question the larger of the two probabilities"
    assert urgent["confidence"] == pytest.approx(max(urgent["noul"], 1 - urgent["noul"]),
                                                 abs=1e-3)
    assert urgent["answer_confidence"] == urgent["confidence"]

    level = answers["frustration"]
    assert set(level) == {"type", "score", "legend", "probabilities", "confidence",
                          "answer_confidence"}
    assert level["type"] == "score"
    assert level["legend"] == {"0": "calm", "1": "annoyed", "2": "angry"}
    assert list(level["probabilities"]) == ["0", "1", "2"]
    assert math.fsum(level["probabilities"].values()) == pytest.approx(1.0, abs=1e-3)
    expected = math.fsum(int(k) * p for k, p in level["probabilities"].items())
    assert level["score"] == pytest.approx(expected, abs=1e-3)
    assert 0.0 <= level["score"] <= 2.0
    assert level["answer_confidence"] == level["probabilities"][str(round(level["score"]))]

    for answer in answers.values():
        assert unit_interval(answer["confidence"])
        assert unit_interval(answer["answer_confidence"])
    assert outcome.routing["model"] == "english"
    assert outcome.routing["reason"]


def test_input_tokens_follow_the_billing_rule_the_estimate_counts(
        decision_engine: DecisionEngine) -> None:
    # The reference: for each question, the text plus that question's instructions and
    # option texts. The estimator (inference/rows/decisions.py) counts the same words.
    rows = [DecisionRow(state=STATE, questions=QUESTIONS),
            DecisionRow(state="a short text", questions={"q": QUESTIONS["urgent"]})]
    outcomes = decision_engine.decide(rows)
    count = decision_engine.count
    text = '{"body":"We were billed twice for March. Please refund it today."}'
    assert outcomes[0].input_tokens == sum(count(text) + count(question_text(q))
                                           for q in QUESTIONS.values())
    assert outcomes[1].input_tokens == count("a short text") + count(
        question_text(QUESTIONS["urgent"]))


def test_a_text_longer_than_the_context_is_cut(decision_engine: DecisionEngine) -> None:
    long_text = "The invoice was paid twice and the customer wants a refund. " * 200
    [outcome] = decision_engine.decide([DecisionRow(state=long_text,
                                                    questions={"q": QUESTIONS["urgent"]})])
    answered(outcome)
    full = decision_engine.count(long_text) + decision_engine.count(
        question_text(QUESTIONS["urgent"]))
    assert outcome.input_tokens < full
    assert outcome.input_tokens <= 512 + decision_engine.count(
        question_text(QUESTIONS["urgent"])) + 2


@pytest.mark.parametrize("state,lang,route", [
    ("We were billed twice for March.", None, "english"),
    ("Нас дважды списали за март.", None, "multilingual"),  # noqa: RUF001
    ("我们三月份被重复扣款了。", None, "multilingual"),
    ("Wir wurden im März doppelt belastet.", "de", "english"),
    ("Bizden mart ayı için iki kez ücret alındı.", "tr", "multilingual"),  # noqa: RUF001
    ("Нас дважды списали за март.", "en", "english"),  # noqa: RUF001
])
def test_rows_are_routed_by_script_and_language(decision_engine: DecisionEngine, state: str,
                                                lang: str | None, route: str) -> None:
    [outcome] = decision_engine.decide([DecisionRow(state=state, lang=lang,
                                                    questions={"q": QUESTIONS["urgent"]})])
    answered(outcome)
    assert outcome.routing["model"] == route
    assert outcome.routing["reason"]


@pytest.mark.parametrize("question,words", [
    ({"type": "noul", "instructions": "Is it urgent?",
      "criteria": {"true": "needs an answer today", "maybe": "unclear"}}, "'maybe'"),
    ({"type": "choice", "criteria": {"a": "x", "b": "y"}}, "no instructions"),
    ({"type": "choice", "instructions": "Which?",
      "criteria": {("refund " * 70) + str(i): "" for i in range(3)}}, "option budget"),
    ({"type": "choice", "instructions": "Which?",
      "criteria": {f"option{i}": "" for i in range(100)}}, "option budget"),
    ({"type": "ranking", "instructions": "Rank them."}, "type"),
    ({"type": "score", "instructions": "How much?", "criteria": "low to high"}, "score"),
])
def test_a_question_the_model_refuses_fails_its_row_alone(
        decision_engine: DecisionEngine, question: dict[str, Any], words: str) -> None:
    rows = [DecisionRow(state=STATE, questions=QUESTIONS),
            DecisionRow(state=STATE, questions={"team": QUESTIONS["team"], "bad": question}),
            DecisionRow(state="Another text.", questions={"urgent": QUESTIONS["urgent"]})]
    first, refused, last = decision_engine.decide(rows)
    answered(first)
    answered(last)
    assert refused.answers is None and refused.input_tokens == 0
    assert refused.error is not None
    assert refused.error.type == "invalid_request_error"
    assert refused.error.status_code == 400
    assert "Question 'bad'" in refused.error.message
    assert words in refused.error.message
    assert refused.error.param == "questions.bad"


def test_a_row_without_a_readable_state_fails_alone(decision_engine: DecisionEngine) -> None:
    refused, fine = decision_engine.decide([
        DecisionRow(state=42, questions=QUESTIONS),  # type: ignore[arg-type]
        DecisionRow(state="text", questions={"urgent": QUESTIONS["urgent"]})])
    assert refused.error is not None and refused.error.param == "state"
    answered(fine)


def test_the_same_rows_give_the_same_answers(decision_engine: DecisionEngine) -> None:
    rows = [DecisionRow(state=STATE, questions=QUESTIONS)]
    assert decision_engine.decide(rows) == decision_engine.decide(rows)


def test_a_step_failing_on_one_row_fails_that_row_and_answers_the_others(
        decision_engine: DecisionEngine) -> None:
    """Issue 21, item 4, for decisions: the engine's step fails whenever one row's prompt is
    in it (a fault injected into the real engine's step, as a GPU fault on one request
    would). The feed runs the step's requests again apart until that row's are alone; it
    fails in its row (a 500, billed nothing), and the chunk's other rows are answered."""
    [reader] = {id(reader): reader for reader in decision_engine.readers.values()}.values()
    engine = reader.llm.llm_engine
    step = engine.step
    poison = "zebra " * 120
    poison_tokens = len(reader.tokenizer.encode(poison, add_special_tokens=False))
    failures: list[int] = []

    def faulty_step() -> Any:
        held = [batch.prompts[position]["prompt_token_ids"]
                for batch, position in reader.feed._waiting.values()]
        if any(len(prompt) > poison_tokens for prompt in held):
            failures.append(len(held))
            raise RuntimeError("an illegal memory access was encountered")
        return step()

    engine.step = faulty_step
    try:
        rows = [DecisionRow(state=STATE, questions=QUESTIONS),
                DecisionRow(state=poison, questions={"urgent": QUESTIONS["urgent"]}),
                DecisionRow(state="Another text.", questions={"urgent": QUESTIONS["urgent"]})]
        first, failed, last = decision_engine.decide(rows)
    finally:
        engine.step = step
    assert failures and max(failures) > 1  # the fault met other rows' requests in its step
    answered(first)
    answered(last)
    assert failed.answers is None and failed.input_tokens == 0
    assert failed.error is not None
    assert (failed.error.type, failed.error.status_code) == ("server_error", 500)
    assert failed.error.param == "questions.urgent"  # the question it failed on
