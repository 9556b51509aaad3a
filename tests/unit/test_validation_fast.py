"""The JSONL checker's two lanes: the chat fast lane (inference/rows/fast.py) takes a block of
plainly valid rows at once, and everything else is checked line by line. Held to one
invariant: whatever the file, both lanes end in the same report, the same refusal, or (a
preflight check) the same list of failing rows."""

from __future__ import annotations

import io
import json
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inference.kinds.chat import ChatKind
from inference.rows.core import InputRejected
from inference.rows.fast import ChatFastRows
from inference.tokens import checkpoint_tokens
from jobs.validation import RowErrors, validate_jsonl
from jobs.validation import lines as lines_module
from jobs.validation.ids import IdSet
from jobs.validation.lines import chunks_bounded
from tests.unit.test_validation_support import chat_line, embed_line, options, words

# checkpoint_dirs: the local tiny-qwen3 checkpoint, built once (an engine-tier fixture).
pytest_plugins = ["tests.engine_fixtures"]


def outcome(data: bytes, model_id: str, fields: dict[str, Any], *, collect: bool,
            counter: Any = words) -> object:
    errors = RowErrors(100) if collect else None
    try:
        report: object = validate_jsonl(io.BytesIO(data), options(model_id, **fields),
                                        count_tokens=counter, errors=errors)
    except InputRejected as rejected:
        report = ("refused", rejected.message)
    if errors is None:
        return report
    return report, [error.as_json() for error in errors.items], errors.count


@pytest.fixture
def fast_blocks(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every block the fast lane was offered: True where it checked it whole."""
    taken: list[bool] = []
    prepare = ChatFastRows.prepare

    def spied(self: ChatFastRows, chunk: bytes, lines: int) -> Any:
        answer = prepare(self, chunk, lines)
        taken.append(answer is not None)
        return answer

    monkeypatch.setattr(ChatFastRows, "prepare", spied)
    return taken


@pytest.fixture
def line_checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first line of every block checked line by line."""
    numbers: list[int] = []
    chunk = lines_module._LineCheck.chunk

    def spied(self: Any, number: int, data: bytes) -> None:
        numbers.append(number)
        chunk(self, number, data)

    monkeypatch.setattr(lines_module._LineCheck, "chunk", spied)
    return numbers


def both_lanes(monkeypatch: pytest.MonkeyPatch, data: bytes, model_id: str,
               fields: dict[str, Any], *, collect: bool, counter: Any = words) -> object:
    fast = outcome(data, model_id, fields, collect=collect, counter=counter)
    with monkeypatch.context() as patched:
        patched.setattr(ChatKind, "fast_rows", lambda self, job: None)
        slow = outcome(data, model_id, fields, collect=collect, counter=counter)
    assert fast == slow
    return fast


# -- a generator of rows, valid and not -------------------------------------------------

WORDS = "the quick brown fox jumps over a lazy dog".split()


def text(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(1, 12)))


def variant(rng: random.Random, n: int, earlier: list[str]) -> object:
    """One line: mostly plain rows, now and then one of everything the fast lane must leave
    to the line-by-line checks (or take and count the same)."""
    custom_id = f"row-{n}"
    line = chat_line(custom_id, text(rng))
    body: dict[str, Any] = line["body"]  # type: ignore[assignment]
    roll = rng.random()
    if roll < 0.55:
        if rng.random() < 0.3:
            body["messages"].insert(0, {"role": "system", "content": text(rng)})
        return line
    odd = rng.choice([
        # thinking settings, each valid or refused by the model or the job
        lambda: body.update(chat_template_kwargs={"enable_thinking": rng.choice(
            [True, False, None])}),
        lambda: body.update(chat_template_kwargs={"reasoning_effort": rng.choice(
            ["low", "xhigh", "max", 5, None])}),
        lambda: body.update(chat_template_kwargs={"enable_thinking": False,
                                                  "reasoning_effort": "low"}),
        lambda: body.update(chat_template_kwargs={}),
        lambda: body.update(chat_template_kwargs={"other": [1, 2]}),
        lambda: body.update(chat_template_kwargs=None),
        lambda: body.update(chat_template_kwargs="yes"),
        lambda: body.update(chat_template_kwargs={"enable_thinking": "yes"}),
        # response formats
        lambda: body.update(response_format={"type": "json_object"}),
        lambda: body.update(response_format={"type": "json_object", "extra": 1}),
        lambda: body.update(response_format={"type": "json_schema", "json_schema": {
            "name": "x", "schema": {"type": "object"}}}),
        lambda: body.update(response_format=None),
        lambda: body.update(response_format="json"),
        # messages
        lambda: body.update(messages=[]),
        lambda: body.update(messages=[{"role": "bot", "content": "hi"}]),
        lambda: body.update(messages=[{"role": "user", "content": [
            {"type": "text", "text": text(rng)}]}]),
        lambda: body.update(messages=[{"role": "user", "content": "hi"},
                                      {"role": "assistant", "content": None}]),
        lambda: body.update(messages=[{"role": "user", "content": "hi", "name": "ann"}]),
        lambda: body.update(messages=[{"role": "assistant", "content": "ok", "tool_calls": [
            {"type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
        lambda: body.update(messages=[{"role": "user", "content": " ".join(["w"] * 400)}]),
        lambda: body.update(model="other", temperature=0.5),
        # the envelope
        lambda: line.update(method="GET"),
        lambda: line.update(url="/v1/embeddings"),
        lambda: line.update(custom_id=""),
        lambda: line.pop("custom_id"),
        lambda: line.update(custom_id=rng.choice(earlier) if earlier else "row-0"),
        lambda: line.update(body=[]),
    ])
    odd()
    if rng.random() < 0.5:
        return line
    # framing: raw lines
    return rng.choice([
        "", "   ", "\r", "not json", json.dumps(line) + " " + json.dumps(line),
        json.dumps(line).encode() + b"\r", b'{"custom_id": "\xff"}',
        '{"custom_id": "s", "method": "POST", "url": "/v1/chat/completions", "body": '
        '{"messages": [{"role": "user", "content": "\\ud800"}]}}',
        '{"custom_id": "n", "method": "POST", "url": "/v1/chat/completions", "body": '
        '{"messages": [{"role": "user", "content": "x"}], "seed": 1e400, "big": '
        '123456789012345678901234567890}}',
        json.dumps(embed_line(custom_id, "x")),
    ])


def file_of(rows: Sequence[object], *, bom: bool = False, final_newline: bool = True) -> bytes:
    lines = [row if isinstance(row, bytes) else row.encode() if isinstance(row, str)
             else json.dumps(row).encode() for row in rows]
    data = b"\n".join(lines) + (b"\n" if final_newline else b"")
    return b"\xef\xbb\xbf" + data if bom else data


def files(seed: int, count: int) -> Iterator[tuple[bytes, str, dict[str, Any]]]:
    rng = random.Random(seed)
    for _ in range(count):
        rows: list[object] = []
        earlier: list[str] = []
        plain = rng.random() < 0.3  # a third of the files are entirely plain rows
        for n in range(rng.randint(1, 60)):
            row = chat_line(f"row-{n}", text(rng)) if plain else variant(rng, n, earlier)
            rows.append(row)
            if isinstance(row, dict) and isinstance(row.get("custom_id"), str):
                earlier.append(row["custom_id"])  # type: ignore[arg-type]
        model_id = rng.choice(["qwen3.8-27b", "gemma4-12b"])
        fields: dict[str, Any] = rng.choice([
            {}, {"max_output_tokens": 65536 - 300}, {"reasoning": False},
            {"reasoning": True, "reasoning_effort": "medium"}, {"reasoning_budget": 100},
        ]) if model_id == "qwen3.8-27b" else rng.choice([{}, {"max_output_tokens": 32000}])
        yield (file_of(rows, bom=rng.random() < 0.1, final_newline=rng.random() < 0.8),
               model_id, fields)


# -- the invariant ----------------------------------------------------------------------

@pytest.mark.parametrize("read_bytes", [64, 700, 256 * 1024])
@pytest.mark.parametrize("collect", [False, True])
def test_both_lanes_agree_on_every_file(monkeypatch: pytest.MonkeyPatch,
                                        fast_blocks: list[bool], read_bytes: int,
                                        collect: bool) -> None:
    # given: small reads, so a file's lines fall into many blocks, some with a fault in them
    monkeypatch.setattr(lines_module, "_READ_BYTES", read_bytes)
    for data, model_id, fields in files(seed=read_bytes + collect, count=150):
        # when / then
        both_lanes(monkeypatch, data, model_id, fields, collect=collect)
    # and the fast lane did take blocks (the comparison is not of one lane with itself)
    assert sum(fast_blocks) > 20
    assert not all(fast_blocks)


def test_a_plain_file_goes_through_the_fast_lane(monkeypatch: pytest.MonkeyPatch,
                                                 fast_blocks: list[bool],
                                                 line_checked: list[int]) -> None:
    monkeypatch.setattr(lines_module, "_READ_BYTES", 4096)
    rows = [chat_line(f"r{n}", "one two three", chat_template_kwargs={
        "enable_thinking": n % 2 == 0, "reasoning_effort": "low" if n % 4 == 0 else None},
        response_format={"type": "json_object"} if n % 3 == 0 else None)
        for n in range(2000)]
    report = outcome(file_of(rows), "qwen3.8-27b", {}, collect=False)
    assert fast_blocks and all(fast_blocks)
    assert not line_checked
    assert report == both_lanes(monkeypatch, file_of(rows), "qwen3.8-27b", {},
                                collect=False)
    assert report.rows == 2000  # type: ignore[attr-defined]
    assert report.usage.input_tokens == 2000 * (3 + 4)  # type: ignore[attr-defined]
    assert report.thinking_rows == 1000  # type: ignore[attr-defined]
    # the rows without an effort think at the model's default
    assert report.effort_rows == {"low": 500, "xhigh": 500}  # type: ignore[attr-defined]
    assert report.response_format_rows == 2000 // 3 + 1  # type: ignore[attr-defined]


def test_a_duplicate_custom_id_many_blocks_later_is_named(
        monkeypatch: pytest.MonkeyPatch, fast_blocks: list[bool]) -> None:
    # given: 5,000 plain rows in blocks of about 40, and row 7's id again at the end
    monkeypatch.setattr(lines_module, "_READ_BYTES", 4096)
    rows: list[object] = [chat_line(f"r{n}", "hello there") for n in range(5000)]
    rows.append(chat_line("r7", "again"))
    # when
    refused = both_lanes(monkeypatch, file_of(rows), "qwen3.8-27b", {}, collect=False)
    # then
    assert refused == ("refused", "Row 'r7': custom_id is used by an earlier line; every "
                                  "row needs its own custom_id")
    assert sum(fast_blocks) > 50


def test_a_row_too_long_for_the_context_is_named_by_the_line_checks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows: list[object] = [chat_line(f"r{n}", "short row") for n in range(100)]
    rows.insert(60, chat_line("long", " ".join(["w"] * 600)))
    refused = both_lanes(monkeypatch, file_of(rows), "qwen3.8-27b",
                         {"max_output_tokens": 65000}, collect=False)
    assert refused == ("refused", "Row 'long' is too long: 604 input tokens and the job's "
                       "max_output_tokens of 65,000 come to 65,604, over the 65,536-token "
                       "context of model 'qwen3.8-27b'. Shorten or split this row, or lower "
                       "max_output_tokens.")


def test_both_lanes_count_the_rendered_prompt_alike(
        monkeypatch: pytest.MonkeyPatch, checkpoint_dirs: dict[str, Path],
        fast_blocks: list[bool]) -> None:
    # given: the checkpoint's own tokenizer and chat template (each row counted as the
    # prompt the engine renders, under its own thinking settings)
    tokens = checkpoint_tokens(checkpoint_dirs["tiny-qwen3"].resolve())
    monkeypatch.setattr(lines_module, "_READ_BYTES", 2048)
    for data, _, _ in files(seed=7, count=40):
        both_lanes(monkeypatch, data, "tiny-qwen3", {}, collect=True, counter=tokens)
        both_lanes(monkeypatch, data, "tiny-qwen3", {"reasoning": False}, collect=False,
                   counter=tokens)
        # rows too long for the context once the job's output is reserved: a counted
        # block handed back to the line checks while the next one is already prepared
        both_lanes(monkeypatch, data, "tiny-qwen3", {"max_output_tokens": 1990},
                   collect=True, counter=tokens)
    assert sum(fast_blocks) > 10


# -- the parts --------------------------------------------------------------------------

def test_the_id_set_finds_a_repeat_across_blocks_and_lanes() -> None:
    ids = IdSet()
    for start in range(0, 10_000, 100):  # 100 blocks: runs merge as they grow
        assert ids.fresh([f"id-{n}" for n in range(start, start + 100)])
    assert len(ids) == 10_000
    assert len(ids._runs) <= 8
    assert not ids.fresh(["new-1", "id-5000"])  # seen before
    assert not ids.fresh(["new-1", "new-1"])  # twice in the block
    assert ids.fresh(["new-1"])  # nothing was kept from the refused blocks
    ids.begin(["id-17", "new-2", "new-2"])
    assert not ids.add("id-17")
    assert ids.add("new-2")
    assert not ids.add("new-2")
    assert not ids.add("id-9999")  # not looked up by begin: searched on its own
    assert ids.add("new-3")
    ids.end()
    assert not ids.fresh(["new-3"])
    assert len(ids) == 10_003


def test_the_id_set_keeps_eight_bytes_a_row() -> None:
    ids = IdSet()
    for start in range(0, 200_000, 2_000):
        ids.fresh([f"row-{n}" for n in range(start, start + 2_000)])
    assert sum(run.nbytes for run in ids._runs) == 200_000 * 8
    assert all(np.all(run[1:] > run[:-1]) for run in ids._runs)


@pytest.mark.parametrize("data,expected", [
    (b"a\nb\nc\n", [(1, 3, b"a\nb\nc\n")]),
    (b"a\nb", [(1, 1, b"a\n"), (2, 1, b"b")]),
    (b"", []),
    (b"\n\n", [(1, 2, b"\n\n")]),
])
def test_chunks_hold_whole_lines(data: bytes, expected: list[object]) -> None:
    assert list(chunks_bounded(io.BytesIO(data), 100)) == expected


def test_chunks_join_a_line_read_over_several_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines_module, "_READ_BYTES", 4)
    data = b"ab\n" + b"x" * 10 + b"\ncd\n"
    chunks = list(chunks_bounded(io.BytesIO(data), 100))
    assert b"".join(chunk for _, _, chunk in chunks if chunk) == data
    assert [(number, lines) for number, lines, _ in chunks] == [(1, 1), (2, 1), (3, 1)]


def test_chunks_skip_a_line_over_the_cap_in_collect_mode(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lines_module, "_READ_BYTES", 4)
    data = b"ab\n" + b"x" * 30 + b"\ncd\n" + b"y" * 30
    chunks = list(chunks_bounded(io.BytesIO(data), 10, skip_long=True))
    assert [(number, lines, chunk) for number, lines, chunk in chunks] == [
        (1, 1, b"ab\n"), (2, 1, None), (3, 1, b"cd\n"), (4, 1, None)]
    with pytest.raises(InputRejected, match="Line 2: the line is longer than 10 bytes"):
        list(chunks_bounded(io.BytesIO(data), 10))
