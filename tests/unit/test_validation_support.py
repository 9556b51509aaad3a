"""What the validation tests share: a deterministic token counter, line builders, and two
ways to run the checker (expecting a report, or expecting a refusal)."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from inference.catalog import CatalogModel, model_get
from inference.rows.core import FileReport, InputRejected, JobOptions
from jobs.validation import validate_jsonl

Probe = Callable[[str], str | None]


def words(text: str) -> int:
    """The tests' tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def model(model_id: str) -> CatalogModel:
    found = model_get(model_id)
    assert found is not None
    return found


def options(model_id: str, **fields: Any) -> JobOptions:
    return JobOptions(model=model(model_id).id, **fields)


def jsonl(rows: Sequence[object]) -> io.BytesIO:
    """dicts become JSON lines; str/bytes are taken as raw lines."""
    lines = []
    for row in rows:
        if isinstance(row, bytes):
            lines.append(row)
        elif isinstance(row, str):
            lines.append(row.encode())
        else:
            lines.append(json.dumps(row).encode())
    return io.BytesIO(b"\n".join(lines) + b"\n")


def check(model_id: str, rows: Sequence[object], *, probe: Probe | None = None,
          **fields: Any) -> FileReport:
    return validate_jsonl(jsonl(rows), options(model_id, **fields), count_tokens=words,
                          probe_content_type=probe)


def refusal(model_id: str, rows: Sequence[object], *, probe: Probe | None = None,
            **fields: Any) -> str:
    with pytest.raises(InputRejected) as caught:
        check(model_id, rows, probe=probe, **fields)
    return caught.value.message


def chat_line(custom_id: str, content: object, **body: object) -> dict[str, object]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": content}], **body}}


def embed_line(custom_id: str, value: object, **body: object) -> dict[str, object]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
            "body": {"input": value, **body}}


def decide_line(custom_id: str, body: dict[str, object]) -> dict[str, object]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/systemone", "body": body}


def test_the_counter_counts_words() -> None:
    assert words("one two  three\nfour") == 4


def test_a_plain_chat_row_passes() -> None:
    report = check("qwen3.8-27b", [chat_line("a", "one two three")])
    assert report.rows == 1
