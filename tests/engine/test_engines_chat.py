"""The chat engine on the real vLLM engine and the local tiny-qwen3 checkpoint.

The checkpoint is trained for a minute to behave like a small real model (a short trace it
closes, a short answer, its end token), not to be right: these tests assert structure,
lengths, validity and where things land (reasoning vs content), never what is said. Where a
limit must bite (a budget, a cap), it is set below what the model writes on its own.
"""

from __future__ import annotations

import json

import jsonschema
import pytest

from inference.engines import ChatEngine, ChatOutcome, ChatRow, ChatSettings
from inference.engines.chat import BUDGET_NOTICE

USER = [{"role": "user", "content": "Say hello in French."}]
OFF = {"enable_thinking": False}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                   "score": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["answer", "score"],
    "additionalProperties": False,
}
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA}}

pytest_plugins = ["tests.engine_fixtures"]


def ok(outcome: ChatOutcome) -> ChatOutcome:
    assert outcome.error is None, outcome.error
    assert outcome.prompt_tokens > 0
    assert outcome.completion_tokens >= outcome.reasoning_tokens >= 0
    return outcome


# The prompts a newcomer's first job sends (README), the e2e tests' and some the model never
# saw the like of.
QUESTIONS = ("Say hello in French.", "Name three colours.", "What is two plus two?", "a",
             "Think, then answer.", "Write a long poem about the sea.",
             "Привет, как дела?", "We were billed twice for March. Please refund it today.")
CAP = 256


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True, "reasoning_effort": "xhigh"},
                                    {"reasoning_effort": "low"}])
def test_the_model_closes_its_trace_answers_and_stops_on_its_own(
        chat_engine: ChatEngine, kwargs: dict[str, object]) -> None:
    rows = [ChatRow(messages=[{"role": "user", "content": text}], chat_template_kwargs=kwargs)
            for text in QUESTIONS]
    for outcome in chat_engine.generate(rows, ChatSettings(max_tokens=CAP)):
        ok(outcome)
        # "stop" with no stop string set: the model wrote its end token, far below the cap.
        assert outcome.finish_reason == "stop"
        assert outcome.completion_tokens < CAP // 4
        assert outcome.reasoning and outcome.content  # the trace closed, an answer followed
        assert 0 < outcome.reasoning_tokens < outcome.completion_tokens
        for text in (outcome.reasoning, outcome.content):
            assert not [mark for mark in ("<think>", "</think>", "<|im_end|>") if mark in text]


def test_with_thinking_off_the_model_answers_and_stops_on_its_own(
        chat_engine: ChatEngine) -> None:
    rows = [ChatRow(messages=[{"role": "user", "content": text}], chat_template_kwargs=OFF)
            for text in QUESTIONS]
    rows.append(ChatRow(messages=[  # a conversation, with a system turn
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"},
        {"role": "assistant", "content": "Hello! How can I help you today?"},
        {"role": "user", "content": "Name three fruits."}], chat_template_kwargs=OFF))
    for outcome in chat_engine.generate(rows, ChatSettings(max_tokens=CAP)):
        ok(outcome)
        assert outcome.finish_reason == "stop"
        assert outcome.completion_tokens < CAP // 8
        assert outcome.reasoning is None and outcome.reasoning_tokens == 0
        assert outcome.content and outcome.content.strip()


def test_thinking_follows_each_rows_own_template_kwargs(chat_engine: ChatEngine) -> None:
    rows = [ChatRow(messages=USER),  # the model's default: thinking on
            ChatRow(messages=USER, chat_template_kwargs=OFF),
            ChatRow(messages=USER, chat_template_kwargs={"enable_thinking": True,
                                                         "reasoning_effort": "low"})]
    on, off, low = chat_engine.generate(rows, ChatSettings(max_tokens=64, reasoning_budget=16))
    for outcome in (on, low):
        ok(outcome)
        assert outcome.reasoning is not None and outcome.reasoning_tokens > 0
    ok(off)
    assert off.reasoning is None and off.reasoning_tokens == 0
    assert off.content is not None
    # The effort is read into the prompt; thinking off renders the empty trace instead.
    assert low.prompt_tokens > on.prompt_tokens
    assert off.prompt_tokens > on.prompt_tokens


def test_reasoning_is_split_out_of_the_content(chat_engine: ChatEngine) -> None:
    [outcome] = chat_engine.generate([ChatRow(messages=USER)],
                                     ChatSettings(max_tokens=64, reasoning_budget=8))
    ok(outcome)
    assert outcome.reasoning is not None and outcome.content is not None
    for text in (outcome.reasoning, outcome.content):
        assert "<think>" not in text and "</think>" not in text
        assert "<|im_end|>" not in text


def test_a_budget_closes_the_trace_with_its_notice_and_the_answer_follows(
        chat_engine: ChatEngine) -> None:
    budget = 4  # well inside the model's own trace (test_the_model_closes_its_trace_...)
    [outcome] = chat_engine.generate([ChatRow(messages=USER)],
                                     ChatSettings(max_tokens=80, reasoning_budget=budget))
    ok(outcome)
    assert outcome.reasoning is not None
    assert outcome.reasoning.splitlines()[-1] == BUDGET_NOTICE
    # The budget's tokens, then the notice closing the trace, all ordinary output tokens.
    assert outcome.reasoning_tokens == budget + chat_engine.budget_notice_tokens
    assert outcome.content is not None
    assert outcome.completion_tokens > outcome.reasoning_tokens


def test_without_a_budget_thinking_can_spend_the_whole_cap(chat_engine: ChatEngine) -> None:
    # A cap shorter than the model's own trace: it ends the row inside the trace.
    [outcome] = chat_engine.generate([ChatRow(messages=USER)],
                                     ChatSettings(max_tokens=6, reasoning_budget=None))
    ok(outcome)
    assert outcome.finish_reason == "length"
    assert outcome.content is None  # the answer never started
    assert outcome.reasoning is not None
    assert outcome.reasoning_tokens == outcome.completion_tokens == 6


def test_the_output_cap_gives_finish_reason_length(chat_engine: ChatEngine) -> None:
    # A cap shorter than the model's own answer.
    [outcome] = chat_engine.generate([ChatRow(messages=USER, chat_template_kwargs=OFF)],
                                     ChatSettings(max_tokens=3))
    ok(outcome)
    assert outcome.finish_reason == "length"
    assert outcome.completion_tokens == 3
    assert outcome.content


def test_structured_output_yields_schema_valid_json(chat_engine: ChatEngine) -> None:
    rows = [ChatRow(messages=USER, chat_template_kwargs=OFF, response_format=JSON_SCHEMA),
            # thinking first, then the grammar from the end of the trace on
            ChatRow(messages=USER, response_format=JSON_SCHEMA)]
    off, thinking = chat_engine.generate(rows, ChatSettings(max_tokens=96, reasoning_budget=4))
    for outcome in (off, thinking):
        ok(outcome)
        assert outcome.finish_reason == "stop"
        assert outcome.format_error is False
        assert outcome.content is not None
        jsonschema.validate(json.loads(outcome.content), SCHEMA)
    assert thinking.reasoning is not None
    assert thinking.reasoning.splitlines()[-1] == BUDGET_NOTICE


def test_json_object_and_text_formats(chat_engine: ChatEngine) -> None:
    rows = [ChatRow(messages=USER, chat_template_kwargs=OFF,
                    response_format={"type": "json_object"}),
            ChatRow(messages=USER, chat_template_kwargs=OFF, response_format={"type": "text"})]
    as_json, as_text = chat_engine.generate(rows, ChatSettings(max_tokens=24))
    ok(as_json)
    ok(as_text)
    assert as_text.format_error is False
    # Constrained, a weak model can still run out of room inside a string: then, and only
    # then, the row is a format error.
    assert as_json.content is not None and as_json.content.startswith("{")
    try:
        valid = isinstance(json.loads(as_json.content), dict)
    except ValueError:
        valid = False
    assert as_json.format_error is (not valid)


def test_a_row_that_cannot_fit_fails_alone(chat_engine: ChatEngine) -> None:
    too_long = [{"role": "user", "content": "refund the invoice today " * 800}]
    rows = [ChatRow(messages=USER, chat_template_kwargs=OFF),
            ChatRow(messages=too_long, chat_template_kwargs=OFF),
            ChatRow(messages=USER)]
    first, refused, last = chat_engine.generate(rows, ChatSettings(max_tokens=8))
    ok(first)
    ok(last)
    assert refused.error is not None
    assert refused.error.type == "invalid_request_error"
    assert refused.error.status_code == 400
    assert refused.error.code == "context_length_exceeded"
    assert "2,048-token context" in refused.error.message
    assert refused.content is None and refused.completion_tokens == 0


def test_a_schema_the_engine_cannot_compile_fails_alone(chat_engine: ChatEngine) -> None:
    broken = {"type": "json_schema", "json_schema": {"name": "broken", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/definitions/missing"}}}}}
    rows = [ChatRow(messages=USER, chat_template_kwargs=OFF, response_format=JSON_SCHEMA),
            ChatRow(messages=USER, chat_template_kwargs=OFF, response_format=broken),
            ChatRow(messages=USER, chat_template_kwargs=OFF)]
    good, refused, plain = chat_engine.generate(rows, ChatSettings(max_tokens=48))
    ok(good)
    ok(plain)
    assert good.content is not None
    jsonschema.validate(json.loads(good.content), SCHEMA)
    assert refused.error is not None
    assert refused.error.type == "invalid_request_error"
    assert refused.error.param == "response_format"


@pytest.mark.parametrize("response_format", [{"type": "xml"},
                                             {"type": "json_schema", "json_schema": {}}])
def test_a_malformed_response_format_fails_its_row(chat_engine: ChatEngine,
                                                   response_format: dict[str, object]) -> None:
    [outcome] = chat_engine.generate([ChatRow(messages=USER, response_format=response_format)],
                                     ChatSettings(max_tokens=4))
    assert outcome.error is not None and outcome.error.param == "response_format"


def test_the_same_chunk_gives_the_same_answers(chat_engine: ChatEngine) -> None:
    # Greedy by default: a redelivered chunk writes the same results.
    rows = [ChatRow(messages=USER, chat_template_kwargs=OFF), ChatRow(messages=USER)]
    settings = ChatSettings(max_tokens=16, reasoning_budget=4)
    assert chat_engine.generate(rows, settings) == chat_engine.generate(rows, settings)


def test_text_parts_are_read_and_other_parts_refused(chat_engine: ChatEngine) -> None:
    parts = [{"type": "text", "text": "Say hello "}, {"type": "text", "text": "in French."}]
    image = [{"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]
    as_parts, as_text, refused = chat_engine.generate(
        [ChatRow(messages=[{"role": "user", "content": parts}], chat_template_kwargs=OFF),
         ChatRow(messages=USER, chat_template_kwargs=OFF),
         ChatRow(messages=[{"role": "user", "content": image}], chat_template_kwargs=OFF)],
        ChatSettings(max_tokens=4))
    # Each text part is customer content encoded as text on its own (issue 22 M1), so a
    # token breaks where one part meets the next: at most one token more per boundary than
    # the same text in one string. (Joining adjacent parts before encoding would give the
    # one string's tokens back: open, in the stop's note.)
    assert ok(as_text).prompt_tokens <= ok(as_parts).prompt_tokens \
        <= ok(as_text).prompt_tokens + len(parts) - 1
    # The part is named as the media path names a part it cannot bring (docs/media.md).
    assert refused.error is not None and refused.error.param == "messages[0].content[1]"
    assert "'image_url'" in refused.error.message


# Issue 43 item 3: what the engine's prefix cache held of a row's prompt.
HARBOUR = ("You answer for the harbour office of Port Anselm. Berths one to nine take ships "
           "under two hundred metres; the night pilot boards at the outer buoy. ") * 12


def test_cached_tokens_are_within_the_prompt_and_a_shared_prefix_is_read_cached(
        chat_engine: ChatEngine) -> None:
    # given a row with a long system prompt, run alone
    def row(question: str) -> ChatRow:
        return ChatRow(messages=[{"role": "system", "content": HARBOUR},
                                 {"role": "user", "content": question}],
                       chat_template_kwargs=OFF)

    settings = ChatSettings(max_tokens=4)
    [first] = chat_engine.generate([row("Which berth for a ninety metre ship?")], settings)
    # when a second row with the same system prompt runs after it
    [second] = chat_engine.generate([row("Where does the pilot board?")], settings)
    # then each reports its cached tokens within its prompt, the second at least the
    # shared prompt's whole cache blocks (vLLM caches whole blocks of 16 tokens)
    assert 0 <= ok(first).cached_tokens <= first.prompt_tokens
    assert 0 < ok(second).cached_tokens < second.prompt_tokens
    assert second.prompt_tokens > 300 and second.cached_tokens >= 256


def test_a_served_chat_row_says_its_cached_tokens_in_openais_field(
        chat_engine: ChatEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    import uuid
    from types import SimpleNamespace
    from typing import Any

    from inference.kinds.base import InputRow
    from inference.kinds.chat import ChatKind
    from inference.kinds.metering import RowMeter

    monkeypatch.setattr("inference.kinds.engines.engine_cached",
                        lambda model_id, kind: chat_engine)
    job: Any = SimpleNamespace(pk=uuid.uuid4(), organization_id=uuid.uuid4(),
                               model="tiny-qwen3", max_output_tokens=4, reasoning=False,
                               reasoning_budget=None, reasoning_effort="",
                               response_format=None, dimensions=None, video_fps=None)
    body = {"messages": [{"role": "system", "content": HARBOUR},
                         {"role": "user", "content": "Is berth four free?"}]}
    rows = [InputRow(0, "a", body), InputRow(1, "b", body),
            InputRow(2, "c", {**body, "messages": [*body["messages"][:1],
                                                   {"role": "user", "content": "And five?"}]})]
    # the system prompt already computed (rows reaching the engine in one step each
    # compute a prefix not yet cached)
    chat_engine.generate([ChatRow(messages=[body["messages"][0],
                                            {"role": "user", "content": "Hello."}],
                                  chat_template_kwargs=OFF)], ChatSettings(max_tokens=1))
    served = ChatKind().serve(job, rows, RowMeter(job, None))
    usage = [item.body["usage"] for item in served if item.body is not None]
    assert len(usage) == 3
    for each in usage:
        assert 0 <= each["prompt_tokens_details"]["cached_tokens"] <= each["prompt_tokens"]
    # the copy computed none of its prompt; the third shares the system prompt
    assert usage[1]["prompt_tokens_details"]["cached_tokens"] == usage[1]["prompt_tokens"]
    assert usage[2]["prompt_tokens_details"]["cached_tokens"] > 0
    assert served[1].usage.merged_rows == 1
    assert served[0].body is not None and served[1].body is not None
    assert served[0].body["choices"] == served[1].body["choices"]
