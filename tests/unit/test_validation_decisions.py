"""Decision rows: the fields a body may carry, the up-front limits, the questions the model
refuses only at serving time, and the per-question token count."""

from __future__ import annotations

import pytest

from inference.pricing import Usage, price
from tests.unit.test_validation_support import check, decide_line, model, refusal

QUESTION = {"type": "noul", "instructions": "Is it urgent?"}
TICKET = {
    "state": {"body": "We were billed twice for March. Please refund it today."},
    "questions": {
        "team": {"type": "choice", "instructions": "Which team should handle this?",
                 "criteria": {"billing": "invoices, payments, refunds",
                              "technical": "bugs and outages", "other": "everything else"}},
        "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
        "frustration": {"type": "score", "instructions": "How frustrated is the customer?",
                        "criteria": ["calm", "annoyed", "angry"]},
    },
}


def body(**fields: object) -> dict[str, object]:
    return {"state": "some text", "questions": {"q": QUESTION}, **fields}


@pytest.mark.parametrize("fields,expected", [
    (body(priority=1),
     "Row 'd': unknown field 'priority': a decision row's body carries only state, "
     "questions, lang and model"),
    (body(max_output_tokens=5),
     "Row 'd': unknown field 'max_output_tokens': a decision row's body carries only state, "
     "questions, lang and model"),
    ({"questions": {"q": QUESTION}},
     "Row 'd': state must be the text to decide on: a string or a JSON object"),
    (body(state=["a"]), "Row 'd': state must be the text to decide on: a string or a JSON "
     "object"),
    (body(state="x" * 50_001),
     "Row 'd': state is 50,001 characters, over the 50,000-character limit"),
    (body(state={"body": "x" * 49_990}),  # {"body":"..."} adds 11 characters
     "Row 'd': state is 50,001 characters as JSON, over the 50,000-character limit"),
    (body(questions=[QUESTION]), "Row 'd': questions must be an object of named questions"),
    (body(questions={}), "Row 'd': questions must be an object of named questions"),
    (body(questions={f"q{n}": QUESTION for n in range(65)}),
     "Row 'd' has 65 questions, over the 64-question limit of model 'laya'"),
    (body(lang=5), "Row 'd': lang must be a language code such as \"de\""),
])
def test_decision_rows_fail_up_front_naming_the_row(fields: dict[str, object],
                                                    expected: str) -> None:
    assert refusal("laya", [decide_line("d", fields)]) == expected


@pytest.mark.parametrize("fields", [
    body(state="x" * 50_000, lang="de", model="anything: the job's model answers"),
    body(state={"body": "x" * 49_989}),
    body(questions={f"q{n}": QUESTION for n in range(64)}),
    # What the model itself refuses fails that row alone at serving time, not the job:
    body(questions={"q": {"type": "noul", "instructions": "Ok?",
                          "criteria": {"true": "yes", "maybe": "?"}}}),
    body(questions={"q": {"type": "choice", "criteria": {"a": "b"}}}),  # no instructions
    body(questions={"q": {"type": "choice", "instructions": "Pick",
                          "criteria": {f"o{n}": "long text " * 40 for n in range(50)}}}),
    body(questions={"q": {"type": "ranking"}}),
    body(questions={"team": "which team?"}),
])
def test_decision_rows_that_pass_up_front(fields: dict[str, object]) -> None:
    assert check("laya", [decide_line("d", fields)]).rows == 1


def test_the_text_is_counted_once_per_question_with_its_instructions_and_options() -> None:
    # {"body":"We ... today."} is 10 words, read for each of the 3 questions: 30.
    # team: 5 + "billing: invoices, payments, refunds" 4 + "technical: bugs and outages" 4
    #       + "other: everything else" 3 = 16; urgent: 7; frustration: 5 + 3 levels = 8.
    report = check("laya", [decide_line("ticket-1", TICKET)])
    assert report.usage == Usage(input_tokens=30 + 16 + 7 + 8)
    assert report.questions == 3 and report.endpoint == "/v1/systemone"


def test_a_300_token_text_asked_ten_short_questions_bills_a_little_over_3000() -> None:
    questions = {f"q{n}": {"type": "noul", "instructions": "Is it ok?"} for n in range(10)}
    report = check("laya", [decide_line("d", {"state": "w " * 300, "questions": questions})])
    assert report.usage.input_tokens == 3000 + 30
    assert price(model("laya"), report.usage).cents == 5  # the $0.05 minimum job
