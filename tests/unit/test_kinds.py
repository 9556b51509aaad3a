"""The task kinds (inference/kinds): one per catalog task, the only readers of the task
string, and what they give the realtime API (its request checks, counts and engine rows)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from inference.catalog import TASKS, catalog_all
from inference.constants import RowOutcome
from inference.engines import DecisionRow, EmbedRow, RowError
from inference.kinds import RequestRefused, ServedRow, kind_for, kind_named, kinds_all
from inference.kinds.decide import DecideKind, DecisionRequest
from inference.kinds.embed import (
    REALTIME_MAX_INPUT_CHARS,
    REALTIME_MAX_INPUTS,
    REALTIME_MAX_TOTAL_CHARS,
    EmbedKind,
)
from inference.rows.decisions import question_text, state_text
from inference.tokens import token_counter
from tests.product import product_sources, relative
from tests.unit.test_validation_support import model

# Every module of the product must ask a kind rather than compare the task string itself.
SWITCH = re.compile(r"""task(_type)? *(==|!=) *["']|task(_type)? +(not +)?in +\(""")


def test_every_catalog_task_has_exactly_one_kind() -> None:
    assert tuple(kind.task for kind in kinds_all()) == TASKS
    for entry in catalog_all().values():
        assert kind_for(entry).task == entry.task
        assert kind_named(entry.task) is kind_for(entry)


def test_nothing_outside_the_kinds_switches_on_the_task_string() -> None:
    found = [f"{relative(path)}:{number}"
             for path in product_sources() if "kinds" not in path.parts
             for number, line in enumerate(path.read_text().splitlines(), start=1)
             if SWITCH.search(line)]
    assert found == []


def test_a_refused_row_is_served_as_its_error_object_and_bills_nothing() -> None:
    error = RowError.invalid_request("too long", code="context_length_exceeded",
                                     param="input")
    served = ServedRow.failed(error)
    assert (served.outcome, served.status_code, served.body) == (RowOutcome.ERROR, 400, None)
    assert served.error == {"message": "too long", "type": "invalid_request_error",
                            "code": "context_length_exceeded", "param": "input"}
    assert served.usage.is_empty


# Realtime embeddings ----------------------------------------------------------------------

EMBED = EmbedKind()


def refused(call: Callable[[], object]) -> tuple[int, str]:
    with pytest.raises(RequestRefused) as caught:
        call()
    return caught.value.status, caught.value.message


def test_a_realtime_embedding_request_becomes_one_engine_row_per_string(
        checkpoints: Path) -> None:
    request = EMBED.realtime_request(model("qwen3-embedding-8b"), ["a query", "another one"],
                                     dimensions=256)
    assert request.rows == [EmbedRow(text="a query", dimensions=256),
                            EmbedRow(text="another one", dimensions=256)]
    # Counted as a batch text row is: each string plus the end-of-text token it pools at.
    count = token_counter("qwen3-embedding-8b")
    assert count is not None
    assert request.input_tokens == count("a query") + count("another one") + 2
    single = EMBED.realtime_request(model("qwen3-embedding-8b"), "a query")
    assert single.rows == [EmbedRow(text="a query", dimensions=None)]


def test_a_realtime_embedding_request_is_not_counted_without_a_tokenizer() -> None:
    request = EMBED.realtime_request(model("qwen3-embedding-8b"), "a query")
    assert request.input_tokens is None


@pytest.mark.parametrize(("value", "status", "message"), [
    (["x"] * (REALTIME_MAX_INPUTS + 1), 400,
     "input has 129 items, over the 128-input limit of one request: split them across "
     "requests, or embed them on the batch API."),
    (["x" * (REALTIME_MAX_INPUT_CHARS + 1)], 400,
     "input[0] is 262,145 characters, over the 262,144-character limit of one input."),
    (["x" * REALTIME_MAX_INPUT_CHARS] * 8 + ["x"], 400,
     "input is 2,097,153 characters in all, over the 2,097,152-character limit of one "
     "request: split it across requests, or embed it on the batch API."),
    ([{"type": "image_url", "image_url": {"url": "https://example.com/p.jpg"}}], 400,
     "input[0] is not text: realtime requests are text only. Embed images and video on the "
     "batch API (embedding jobs); their vectors share the space of a realtime text query on "
     "the same model and width."),
    ([], 400, "input is an empty list: send at least one string."),
    (["fine", ""], 400, "input[1] is an empty string: every input needs text."),
    ([7], 422, "input[0] must be a string."),
    ({"text": "x"}, 422, "input must be a string or a list of strings."),
])
def test_a_realtime_embedding_request_past_the_rules_is_refused(
        value: object, status: int, message: str) -> None:
    assert REALTIME_MAX_TOTAL_CHARS < 9 * REALTIME_MAX_INPUT_CHARS
    assert refused(lambda: EMBED.realtime_request(model("qwen3-vl-embedding-2b"), value)) \
        == (status, message)


def test_a_realtime_embedding_width_is_the_batch_range() -> None:
    assert refused(lambda: EMBED.realtime_request(model("qwen3-vl-embedding-2b"), "x",
                                                  dimensions=4096)) \
        == (422, "dimensions must be from 64 to 2048 on 'qwen3-vl-embedding-2b'; got 4096.")


# Realtime decisions -----------------------------------------------------------------------

DECIDE = DecideKind()
QUESTIONS: dict[str, dict[str, Any]] = {
    "team": {"type": "choice", "instructions": "Which team should handle this?",
             "criteria": {"billing": "invoices, payments, refunds", "other": ""}},
    "urgent": {"type": "noul", "instructions": "Does the customer need an answer today?"},
}


def test_a_realtime_decision_is_counted_as_a_batch_row_is(checkpoints: Path) -> None:
    state = {"body": "We were billed twice for March. Please refund it today."}
    request = DECIDE.realtime_request(model("laya"), {"model": "laya", "state": state,
                                                      "questions": QUESTIONS, "lang": "en"})
    count = token_counter("laya")
    assert count is not None
    text = state_text(state)
    assert text is not None
    assert request == DecisionRequest(
        row=DecisionRow(state=state, questions=QUESTIONS, lang="en"),
        input_tokens=sum(count(text) + count(question_text(q)) for q in QUESTIONS.values()))


@pytest.mark.parametrize(("body", "status", "message"), [
    ({"state": "x" * 50_001, "questions": QUESTIONS}, 400,
     "This request: state is 50,001 characters, over the 50,000-character limit"),
    ({"state": "x", "questions": {f"q{i}": QUESTIONS["urgent"] for i in range(65)}}, 400,
     "This request has 65 questions, over the 64-question limit of model 'laya'"),
    ({"state": 7, "questions": QUESTIONS}, 422,
     "This request: state must be the text to decide on: a string or a JSON object"),
    ({"state": "x", "questions": {}}, 422,
     "This request: questions must be an object of named questions"),
    ({"state": "x", "questions": QUESTIONS, "stream": True}, 422,
     "This request: unknown field 'stream': a decision row's body carries only state, "
     "questions, lang and model"),
])
def test_a_realtime_decision_past_the_rules_is_refused(body: dict[str, object], status: int,
                                                       message: str) -> None:
    assert refused(lambda: DECIDE.realtime_request(model("laya"), body)) == (status, message)
