"""Chat rows: messages, per-row thinking and effort, per-row response_format, context fit,
and the report's sums."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from inference.pricing import Usage
from tests.unit.test_validation_support import chat_line, check, refusal

SCHEMA = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}}}


def body_line(custom_id: str, body: dict[str, object]) -> dict[str, object]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": body}


@pytest.mark.parametrize("line,expected", [
    (body_line("a", {}), "Row 'a': messages must be a non-empty list of messages"),
    (body_line("a", {"messages": []}), "Row 'a': messages must be a non-empty list of messages"),
    (body_line("a", {"messages": "hi"}),
     "Row 'a': messages must be a non-empty list of messages"),
    (body_line("a", {"messages": ["hi"]}),
     "Row 'a': messages[0] must be an object with a role and content"),
    (body_line("a", {"messages": [{"role": "user", "content": "x"}, {"role": "bot"}]}),
     "Row 'a': messages[1].role must be one of system, developer, user, assistant, tool"),
    (chat_line("a", 5), "Row 'a': messages[0].content must be a string or a list of content "
     "parts"),
    (chat_line("a", None), "Row 'a': messages[0].content must be a string or a list of "
     "content parts"),
    (chat_line("a", ["hi"]),
     "Row 'a': messages[0].content[0] must be a content part object with a type"),
    (chat_line("a", [{"type": "text", "text": 5}]),
     "Row 'a': messages[0].content[0].text must be a string"),
    (chat_line("a", [{"type": "input_image", "image_url": "x"}]),
     "Row 'a': unsupported content part type 'input_image': supported types are text, "
     "image_url, input_audio, audio_url, video_url"),
    (chat_line("a", [{"type": ["text"], "text": "x"}]),
     "Row 'a': unsupported content part type '['text']': supported types are text, "
     "image_url, input_audio, audio_url, video_url"),
    (chat_line("a", [{"text": "no type"}]),
     "Row 'a': unsupported content part type 'None': supported types are text, image_url, "
     "input_audio, audio_url, video_url"),
])
def test_message_shape(line: dict[str, object], expected: str) -> None:
    assert refusal("qwen3.8-27b", [line]) == expected


@pytest.mark.parametrize("model_id,kwargs,job,expected", [
    ("qwen3.8-27b", "on", {}, "Row 'a': chat_template_kwargs must be an object"),
    ("qwen3.8-27b", {"enable_thinking": "yes"}, {},
     "Row 'a': chat_template_kwargs.enable_thinking must be true or false"),
    ("gemma4-12b", {"enable_thinking": True}, {},
     "Row 'a': chat_template_kwargs.enable_thinking is true, but model 'gemma4-12b' produces "
     "no reasoning trace; drop the setting or choose a reasoning model"),
    ("nemotron-3-nano-omni-30b", {"enable_thinking": False}, {"reasoning_budget": 2048},
     "Row 'a': chat_template_kwargs.enable_thinking is false, but the job sets "
     "reasoning_budget 2048, which needs thinking on; remove the row's setting or submit the "
     "job without a reasoning_budget"),
    ("nemotron-3-nano-omni-30b", {"reasoning_effort": "low"}, {},
     "Row 'a': chat_template_kwargs.reasoning_effort: model 'nemotron-3-nano-omni-30b' has "
     "no thinking effort levels"),
    ("gemma4-12b", {"reasoning_effort": "low"}, {},
     "Row 'a': chat_template_kwargs.reasoning_effort: model 'gemma4-12b' has no thinking "
     "effort levels"),
    ("qwen3.8-27b", {"reasoning_effort": "High"}, {},
     "Row 'a': chat_template_kwargs.reasoning_effort 'High' is not a level of model "
     "'qwen3.8-27b', which takes low, medium or xhigh (case-sensitive)"),
    ("qwen3.8-27b", {"reasoning_effort": "high"}, {},
     "Row 'a': chat_template_kwargs.reasoning_effort 'high' is not a level of model "
     "'qwen3.8-27b', which takes low, medium or xhigh (case-sensitive)"),
    ("qwen3.8-27b", {"reasoning_effort": 3}, {},
     "Row 'a': chat_template_kwargs.reasoning_effort 3 is not a level of model "
     "'qwen3.8-27b', which takes low, medium or xhigh (case-sensitive)"),
    ("qwen3.8-27b", {"reasoning_effort": "low", "enable_thinking": False}, {},
     "Row 'a': chat_template_kwargs.reasoning_effort needs thinking on, but the row turns "
     "it off"),
    ("qwen3.8-27b", {"reasoning_effort": "low"}, {"reasoning": False},
     "Row 'a': chat_template_kwargs.reasoning_effort needs thinking on, but the job "
     "(reasoning: false) turns it off"),
])
def test_per_row_thinking_rules(model_id: str, kwargs: object, job: dict[str, Any],
                                expected: str) -> None:
    line = chat_line("a", "hi", chat_template_kwargs=kwargs)
    assert refusal(model_id, [line], **job) == expected


@pytest.mark.parametrize("model_id,kwargs,job", [
    ("gemma4-12b", {"enable_thinking": False}, {}),  # false is valid on every model
    ("qwen3.8-27b", {"enable_thinking": False}, {"reasoning_budget": 0}),  # 0: no cap
    ("qwen3.8-27b", {"enable_thinking": False, "custom": 1}, {}),  # other keys left alone
    ("qwen3.8-27b", {"enable_thinking": True, "reasoning_effort": "low"},
     {"reasoning": False}),  # the row's own setting wins
    ("qwen3.8-27b", {"enable_thinking": None}, {"reasoning_budget": 64}),
])
def test_per_row_thinking_that_passes(model_id: str, kwargs: object,
                                      job: dict[str, Any]) -> None:
    assert check(model_id, [chat_line("a", "hi", chat_template_kwargs=kwargs)], **job).rows == 1


@pytest.mark.parametrize("response_format,expected", [
    ("json", "Row 'a': response_format must be an object with a type."),
    ({"type": "text"},
     "Row 'a': response_format.type must be json_schema or json_object, not 'text'."),
    ({"json_schema": {"schema": {}}}, "Row 'a': response_format must be an object with a type."),
    ({"type": "json_schema", "json_schema": {"name": "p"}},
     "Row 'a': response_format of type json_schema needs an object at "
     "response_format.json_schema.schema."),
    ({"type": "json_schema", "schema": {"type": "object"}},
     "Row 'a': response_format of type json_schema needs an object at "
     "response_format.json_schema.schema."),
    ({"type": "json_schema", "json_schema": {"schema": "object"}},
     "Row 'a': response_format of type json_schema needs an object at "
     "response_format.json_schema.schema."),
])
def test_a_rows_response_format_is_checked_structurally(response_format: object,
                                                       expected: str) -> None:
    line = chat_line("a", "hi", response_format=response_format)
    assert refusal("gemma4-12b", [line]) == expected


def test_a_well_formed_but_unsatisfiable_schema_still_passes() -> None:
    odd = {"type": "json_schema", "json_schema": {"schema": {"type": "nonsense"}}}
    assert check("gemma4-12b", [chat_line("a", "hi", response_format=odd)]).rows == 1


def text(words: int) -> str:
    return "w " * words


@pytest.mark.parametrize("model_id,line,job,expected", [
    ("gemma4-12b", chat_line("a", text(32_765)), {},
     "Row 'a' is too long: 32,769 input tokens exceeds the 32,768-token maximum that model "
     "'gemma4-12b' can serve. Shorten or split this row."),
    ("qwen3.8-27b", chat_line("a", text(65_533)), {},
     "Row 'a' is too long: 65,537 input tokens exceeds the 65,536-token maximum that model "
     "'qwen3.8-27b' can serve. Shorten or split this row."),
    ("gemma4-12b", chat_line("a", text(30_000)), {"max_output_tokens": 4_000},
     "Row 'a' is too long: 30,004 input tokens and the job's max_output_tokens of 4,000 come "
     "to 34,004, over the 32,768-token context of model 'gemma4-12b'. Shorten or split this "
     "row, or lower max_output_tokens."),
])
def test_a_row_must_fit_the_models_context(model_id: str, line: dict[str, object],
                                           job: dict[str, Any], expected: str) -> None:
    assert refusal(model_id, [line], **job) == expected


def test_rows_with_images_on_qwen3_8_take_the_media_context() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://e.com/a.png"}}
    line = chat_line("a", [{"type": "text", "text": text(100_000)}, image])
    report = check("qwen3.8-27b", [line])
    assert report.max_input_tokens == 100_004 + 1280
    assert report.output_headroom == 131_072 - 100_004 - 1280
    over = chat_line("b", [{"type": "text", "text": text(129_789)}, image])
    assert refusal("qwen3.8-27b", [over]) == (
        "Row 'b' is too long: 131,073 input tokens (including media) exceeds the "
        "131,072-token maximum that model 'qwen3.8-27b' can serve with image input. Shorten "
        "or split this row.")


def test_chat_usage_counts_message_text_template_overhead_and_tool_calls() -> None:
    line = body_line("a", {"messages": [
        {"role": "system", "content": "be brief"},                       # 2 + 4
        {"role": "user", "content": [{"type": "text", "text": "hi "},
                                     {"type": "text", "text": "there"}]},  # 2 + 4
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}},
        ]},                                                               # 3 + 4
        {"role": "tool", "content": "result here"},                        # 2 + 4
    ]})
    report = check("qwen3.8-27b", [line, chat_line("b", "one two three")])  # 3 + 4
    assert report.usage == Usage(input_tokens=6 + 6 + 7 + 6 + 7)
    assert report.rows == 2 and report.max_input_tokens == 25
    assert report.output_headroom == 65_536 - 25


def test_chat_usage_with_media_fills_usage_as_pricing_defines_it() -> None:
    image = {"type": "image_url", "image_url": {"url": "https://e.com/a.jpg"}}
    audio = {"type": "audio_url", "audio_url": {"url": "https://e.com/a.mp3",
                                                "duration_seconds": 10}}
    video = {"type": "video_url", "video_url": {"url": "https://e.com/a.mp4",
                                                "duration_seconds": 10}}
    rows = [chat_line("m", [{"type": "text", "text": "a b c"}, image, audio, video]),
            chat_line("t", "x y")]
    report = check("nemotron-3-nano-omni-30b", rows)
    # image 768; audio 10 s x 12.5 = 125; video at the default 2 fps: (20 + 1) x 64 = 1,344
    assert report.usage == Usage(input_tokens=7 + 6, media_tokens=768 + 125 + 1344, images=1,
                                 clips=2, media_seconds=Decimal(20))
    assert report.max_input_tokens == 7 + 2237
    assert report.output_headroom == 32_768 - 2244
    assert report.media_rows == 1 and report.estimated_clips == 0


def test_the_report_counts_thinking_effort_and_own_response_formats() -> None:
    rows = [
        chat_line("default", "hi"),
        chat_line("off", "hi", chat_template_kwargs={"enable_thinking": False}),
        chat_line("low", "hi", chat_template_kwargs={"reasoning_effort": "low"}),
        chat_line("schema", "hi", response_format=SCHEMA),
        chat_line("object", "hi", response_format={"type": "json_object"}),
    ]
    report = check("qwen3.8-27b", rows, reasoning_effort="medium")
    assert report.thinking_rows == 4
    assert report.effort_rows == {"medium": 3, "low": 1}
    assert report.response_format_rows == 2


def test_thinking_follows_the_job_then_the_model() -> None:
    on = chat_line("on", "hi", chat_template_kwargs={"enable_thinking": True})
    assert check("qwen3.8-27b", [on, chat_line("b", "hi")], reasoning=False).thinking_rows == 1
    assert check("nemotron-3-nano-omni-30b", [chat_line("a", "hi")]).effort_rows == {}
    assert check("nemotron-3-nano-omni-30b", [chat_line("a", "hi")]).thinking_rows == 1
    assert check("gemma4-12b", [chat_line("a", "hi")], reasoning=False).thinking_rows == 0
