"""JSONL framing and the request envelope: one request object per line, unique custom_ids,
one endpoint per file, the endpoint the model serves; and a large file in bounded memory."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest

from inference.rows.core import RowRejected
from jobs.validation import validate_jsonl
from jobs.validation.ids import DigestSet
from tests.unit.test_validation_support import (
    chat_line,
    check,
    decide_line,
    embed_line,
    options,
    refusal,
    words,
)

CHAT = chat_line("a", "hello")
EMBED = embed_line("e", "hello")


@pytest.mark.parametrize("rows,expected", [
    (["not json"],
     "Line 1: not valid JSON (Expecting value at column 1); each line must be one request "
     "object"),
    ([CHAT, "[1, 2]"],
     "Line 2: not a JSON object; each line must be one request object with custom_id, "
     "method, url and body"),
    ([CHAT, '{"method": "POST"}'],
     "Line 2: custom_id is missing; every line needs a custom_id string"),
    ([CHAT, '{"custom_id": 1, "method": "POST"}'],
     "Line 2: custom_id must be a non-empty string, not 1"),
    ([{**CHAT, "custom_id": ""}], "Line 1: custom_id must be a non-empty string, not ''"),
    ([CHAT, "[" * 100_000 + "]" * 100_000],
     "Line 2: not valid JSON (nested too deeply); each line must be one request object"),
    ([CHAT, "", chat_line("b", "hi")],
     "Line 2: the line is blank; a JSONL input has one request per line and no blank lines "
     "between them"),
    ([CHAT, b'{"custom_id": "x", "v": NaN}'],
     "Line 2: not valid JSON; each line must be one request object"),
    ([b'{"custom_id": "\xff"}'], "Line 1: not valid JSON; each line must be one request object"),
    ([CHAT, chat_line("b", "x"), chat_line("a", "again")],
     "Row 'a': custom_id is used by an earlier line; every row needs its own custom_id"),
    ([{**CHAT, "method": "GET"}], "Row 'a': method must be \"POST\", not 'GET'"),
    ([{**CHAT, "url": "/v1/responses"}],
     "Row 'a': url '/v1/responses' is not an endpoint a batch job takes: "
     "/v1/chat/completions, /v1/embeddings or /v1/systemone"),
    ([EMBED],
     "Row 'e': url '/v1/embeddings' does not match model 'qwen3.8-27b': a chat model takes "
     "/v1/chat/completions rows"),
    ([CHAT, EMBED],
     "Row 'e': url '/v1/embeddings' mixes endpoints: this file's rows target "
     "/v1/chat/completions, and a file's rows must all target the same endpoint"),
    ([{**CHAT, "body": []}], "Row 'a': body must be a JSON object"),
])
def test_framing_and_envelope_violations_name_the_line(rows: list[object],
                                                       expected: str) -> None:
    assert refusal("qwen3.8-27b", rows) == expected


@pytest.mark.parametrize("model_id,rows,expected", [
    ("qwen3-embedding-8b", [CHAT],
     "Row 'a': url '/v1/chat/completions' does not match model 'qwen3-embedding-8b': an "
     "embedding model takes /v1/embeddings rows"),
    ("laya", [EMBED],
     "Row 'e': url '/v1/embeddings' does not match model 'laya': a decision model takes "
     "/v1/systemone rows"),
    ("qwen3-vl-embedding-2b", [EMBED, CHAT],
     "Row 'a': url '/v1/chat/completions' mixes endpoints: this file's rows target "
     "/v1/embeddings, and a file's rows must all target the same endpoint"),
    ("laya", [decide_line("d", {"state": "s", "questions": {"q": {}}}), CHAT],
     "Row 'a': url '/v1/chat/completions' mixes endpoints: this file's rows target "
     "/v1/systemone, and a file's rows must all target the same endpoint"),
])
def test_rows_follow_the_models_task(model_id: str, rows: list[object],
                                     expected: str) -> None:
    assert refusal(model_id, rows) == expected


def test_an_empty_file_has_no_rows() -> None:
    assert refusal("qwen3.8-27b", ["", ""]) == \
        "The input file has no rows: a job needs at least one request."


def test_trailing_blank_lines_crlf_and_a_bom_are_fine() -> None:
    first = b"\xef\xbb\xbf" + json.dumps(CHAT).encode() + b"\r"
    report = check("qwen3.8-27b", [first, chat_line("b", "x y"), "", "  ", ""])
    assert report.rows == 2


def test_a_rejection_carries_the_row_and_is_a_row_rejected() -> None:
    with pytest.raises(RowRejected) as caught:
        check("qwen3.8-27b", [CHAT, CHAT])
    assert caught.value.row == "Row 'a'"


def test_a_very_long_custom_id_is_quoted_short() -> None:
    message = refusal("qwen3.8-27b", [{**CHAT, "custom_id": "z" * 500, "method": "PUT"}])
    assert message == f"Row '{'z' * 200}...': method must be \"POST\", not 'PUT'"


def test_the_model_and_other_body_fields_on_a_line_are_ignored() -> None:
    line = chat_line("a", "hi", model="gpt-4o", max_completion_tokens=9, temperature=2,
                     tools=[{"type": "function"}])
    assert check("gemma4-12b", [line]).rows == 1


def test_the_digest_set_finds_repeats_as_it_grows() -> None:
    ids = DigestSet(capacity=4)
    assert all(ids.add(f"row-{n}") for n in range(10_000))
    assert len(ids) == 10_000
    assert not any(ids.add(f"row-{n}") for n in range(0, 10_000, 7))


def test_a_large_file_streams_in_bounded_memory(tmp_path: Path) -> None:
    # given: 50k rows, ~5 MB on disk; parsed into Python objects they would take ~50 MB
    rows = 50_000
    path = tmp_path / "big.jsonl"
    with path.open("w") as handle:
        for n in range(rows):
            handle.write(json.dumps(chat_line(f"row-{n}", f"say hello number {n}")) + "\n")
    # when
    tracemalloc.start()
    try:
        with path.open("rb") as stream:
            report = validate_jsonl(stream, options("qwen3.8-27b"), count_tokens=words)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # then: only the running sums and one 8-byte slot (at most half full) per custom_id
    assert report.rows == rows
    assert report.usage.input_tokens == rows * (4 + 4)  # 4 words + 4 template tokens
    assert peak < 6 * 1024 * 1024, peak
