"""Whatever a line holds, the checker answers with a report or a rejection, never with a
crash (a crash would fail the job as internal_error instead of invalid_input)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.rows.core import FileReport, InputRejected
from tests.unit.test_validation_media_files import data_uri, mp4_bytes, png_bytes, wav_bytes
from tests.unit.test_validation_support import check

MODELS = ["qwen3.8-27b", "nemotron-3-nano-omni-30b", "gemma4-12b", "qwen3-embedding-8b",
          "qwen3-vl-embedding-8b", "laya"]
URLS = ["https://e.com/a.mp4", "https://e.com/clip", "http://e.com/a.png", "data:,x",
        data_uri("image/png", png_bytes()), data_uri("video/mp4", mp4_bytes(3, fps=5)),
        data_uri("audio/wav", wav_bytes(0.5)), data_uri("audio/wav", b"RIFF" + bytes(3)),
        "data:video/webm;base64,GkXfo59CgoR3ZWJtQoeBAhhTgGcBAAAAAAAAAA==", "data:;base64,"]
TEXT = st.text(max_size=12)
scalars = st.none() | st.booleans() | st.integers(-3, 70_000) | st.floats(allow_nan=False) \
    | TEXT | st.sampled_from(URLS)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(TEXT, inner, max_size=3), max_leaves=8)
media_fields = st.fixed_dictionaries({}, optional={
    "url": st.sampled_from(URLS) | json_values, "data": st.sampled_from(["AAAA", "!!"]),
    "format": st.sampled_from(["wav", "mp3", "wma", "x"]) | json_values,
    "duration_seconds": st.sampled_from([0, -1, 3, 1e9, "4"]) | json_values,
})
parts = st.fixed_dictionaries({
    "type": st.sampled_from(["text", "image_url", "input_audio", "audio_url", "video_url",
                             "file"]) | json_values,
}, optional={"text": json_values, "image_url": media_fields, "input_audio": media_fields,
             "audio_url": media_fields, "video_url": media_fields})
messages = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system", "bot"]),
}, optional={"content": TEXT | st.lists(parts, max_size=3) | json_values,
             "tool_calls": json_values}), max_size=3)
bodies = st.fixed_dictionaries({}, optional={
    "messages": messages | json_values, "input": TEXT | st.lists(parts, max_size=3)
    | json_values, "chat_template_kwargs": st.fixed_dictionaries({}, optional={
        "enable_thinking": json_values, "reasoning_effort": st.sampled_from(["low", "x"])})
    | json_values, "response_format": json_values, "dimensions": json_values,
    "encoding_format": json_values, "state": json_values, "questions": json_values,
    "lang": json_values,
})
lines = st.fixed_dictionaries({
    "custom_id": st.sampled_from(["a", "b"]) | json_values,
    "method": st.sampled_from(["POST", "GET"]),
    "url": st.sampled_from(["/v1/chat/completions", "/v1/embeddings", "/v1/systemone"]),
    "body": bodies | json_values,
})


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(model_id=st.sampled_from(MODELS), rows=st.lists(lines | json_values, min_size=1,
                                                       max_size=3),
       job=st.fixed_dictionaries({}, optional={
           "reasoning_budget": st.sampled_from([0, 64]), "reasoning": st.booleans(),
           "video_fps": st.sampled_from([0.5, 20.0]), "max_output_tokens": st.just(1000)}))
def test_every_input_gets_a_report_or_a_rejection(model_id: str, rows: list[Any],
                                                  job: dict[str, Any]) -> None:
    raw = [json.dumps(row) for row in rows]
    try:
        report = check(model_id, raw, probe=lambda url: None, **job)
    except InputRejected as rejected:
        assert rejected.message
    else:
        assert isinstance(report, FileReport) and report.rows == len(rows)
