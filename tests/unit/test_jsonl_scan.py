"""Issue 40 H1: an OpenAI batch's create finds its model by scanning a long line for
body.model (jobs/jsonl_scan.py), never by decoding it whole. The scan must read what the
one JSONL reader (jobs.jsonl.line_loads) reads on every valid line, however the line is cut
into blocks - the last of duplicate keys, keys spelled with escapes, escaped quotes and
backslash runs across a block's edge - and hold bounded memory on a 24 MiB line."""

from __future__ import annotations

import io
import json
import random
import tracemalloc
from typing import Any

import pytest

from jobs.jsonl import line_loads
from jobs.jsonl_scan import (
    BLOCK_BYTES,
    MODEL_LABEL_CHARS,
    WHOLE_LINE_BYTES,
    BodyModelScan,
    lines_body_model,
)

MiB = 1024 * 1024


def read_model(line: bytes) -> str | None:
    """body.model as line_loads reads it: the rule the scan must follow."""
    request = line_loads(line)
    body = request.get("body") if isinstance(request, dict) else None
    model = body.get("model") if isinstance(body, dict) else None
    return model if isinstance(model, str) and model else None


def scanned(line: bytes, cuts: random.Random | int) -> str | None:
    """The scan fed the line in blocks of a fixed size, or of random sizes."""
    scan = BodyModelScan()
    at = 0
    while at < len(line):
        size = cuts if isinstance(cuts, int) else cuts.randint(1, 40)
        scan.feed(line[at:at + size])
        at += size
    return scan.model()


CASES = {
    "first": b'{"body": {"model": "m1", "messages": []}}',
    "after an array": b'{"body": {"messages": [{"model": "x"}], "model": "m2"}}',
    "a duplicate model, the last wins": b'{"body": {"model": "a", "model": "b"}}',
    "a second body without one": b'{"body": {"model": "a"}, "body": {"messages": []}}',
    "a second body": b'{"body": {"model": "a"}, "body": {"model": "c"}}',
    "model in another member": b'{"x": {"model": "a"}, "body": {"model": "c"}}',
    "model as a value": b'{"body": {"x": "model", "y": 1}}',
    "keys spelled with escapes": b'{"b\\u006fdy": {"m\\u006Fdel": "esc"}}',
    "escapes in the value": b'{"body": {"model": "we\\"ird\\\\"}}',
    "a number": b'{"body": {"model": 5}}',
    "empty": b'{"body": {"model": ""}}',
    "body an array": b'{"body": ["model", "x"]}',
    "spaced": b'  {  "body"  :  {  "model"  :  "spaced"  }  }  ',
    "after a backslash": b'{"body": {"a": "\\\\", "model": "after-bs"}}',
    "a key inside a string": b'{"body": {"a": "x\\"model\\":\\"no\\"", "model": "yes"}}',
    "deeper": b'{"body": {"model": "a", "nested": {"model": "deep"}}}',
    "not an object": b'[{"body": {"model": "a"}}]',
    "unicode escapes": b'{"body": {"model": "\\u00e9t\\u00e9"}}',
    "brackets in strings": b'{"body": {"a": "}}]]", "model": "x{["}}',
}


@pytest.mark.parametrize("case", CASES)
def test_the_scan_reads_what_line_loads_reads(case: str) -> None:
    line = CASES[case]
    expected = read_model(line)
    for block in (1, 2, 3, 5, 7, 16, 4096):
        assert scanned(line, block) == expected, block


class Lines:
    """Random request-like lines, written as raw JSON so that keys can repeat, be spelled
    with escapes and be spaced out, and strings can hold escaped quotes and backslash runs
    (the shapes a block's edge can cut badly)."""

    KEYS = ["body", "model", "b\\u006fdy", "m\\u006Fdel", "\\u006dodel", "x", "mode",
            "models", "bodyy", 'a\\"b', "\\\\", "model\\\\", ""]
    TEXTS = ["hello", 'a\\"b', "\\\\", '\\\\\\"', "model", "body", "{[}]", "é", "\\u00e9",
             "m1", "", '\\"model\\":'] + ["x" * n for n in (40, 80)]

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def space(self) -> str:
        return self.random.choice(["", "", "", " ", "  ", "\t", " \r "])

    def text(self) -> str:
        return '"' + self.random.choice(self.TEXTS) + '"'

    def value(self, depth: int) -> str:
        roll = self.random.random()
        if depth > 4 or roll < 0.3:
            return self.random.choice([self.text(), self.text(), "1", "-2.5e3", "true",
                                       "false", "null"])
        return self.array(depth + 1) if roll < 0.6 else self.object(depth + 1)

    def array(self, depth: int) -> str:
        items = (self.value(depth) for _ in range(self.random.randint(0, 4)))
        return "[" + self.space() + ("," + self.space()).join(items) + self.space() + "]"

    def object(self, depth: int) -> str:
        members = []
        for _ in range(self.random.randint(0, 4)):
            key = self.random.choice(self.KEYS if self.random.random() < 0.6
                                     else ["body", "model"])
            value = self.value(depth)
            if "odel" in key and self.random.random() < 0.6:
                value = self.text()
            if key in ("body", "b\\u006fdy") and self.random.random() < 0.7:
                value = self.object(depth + 1)
            members.append(f'{self.space()}"{key}"{self.space()}:{self.space()}{value}'
                           f'{self.space()}')
        return "{" + ",".join(members) + "}"

    def line(self) -> bytes:
        top = self.object(0) if self.random.random() < 0.95 else self.array(0)
        return (self.space() + top + self.space()).encode()


def test_on_generated_lines_the_scan_reads_what_line_loads_reads() -> None:
    lines, cuts = Lines(40), random.Random(41)
    checked = 0
    for _ in range(600):
        line = lines.line()
        try:
            expected = read_model(line)
        except ValueError:
            continue  # not JSON: the scan gives no promise on it (the checks name it)
        checked += 1
        for block in (cuts, 7, 1 << 20):
            assert scanned(line, block) == expected, (block, line)
    assert checked > 400


def test_a_line_that_is_not_json_never_breaks_the_scan() -> None:
    # whatever the bytes (a create must answer, not fail), cut anywhere
    pieces = [b'"body"', b'"model"', b'"b\\u006fdy"', b'\\"', b"\\\\", b"{", b"}", b"[",
              b"]", b":", b",", b'"', b" ", b"\xc3\xa9", b"\xff", b"x", b"0"]
    generator = random.Random(42)
    for _ in range(500):
        line = b"{" + b"".join(generator.choice(pieces)
                               for _ in range(generator.randint(0, 120)))
        for block in (1, 3, 17, 1000):
            scanned(line, block)


def body_model_lines(content: bytes) -> list[tuple[int, int, str | None]]:
    return [(line.number, line.size, line.model) for line in lines_body_model(
        io.BytesIO(content), lines=100, max_bytes=64 * MiB)]


def request(model: Any, **body: Any) -> bytes:
    return json.dumps({"custom_id": "r", "method": "POST", "url": "/v1/chat/completions",
                       "body": {"model": model, **body}}).encode()


def test_short_lines_are_read_by_line_loads_as_the_checks_read_them() -> None:
    # NaN is not JSON to the checks: such a line names no model (it was read by json.loads,
    # which takes NaN); a byte-order mark opens line 1 only; a blank line names nothing
    nan = b'{"body": {"model": "m", "temperature": NaN}}'
    content = b"\xef\xbb\xbf" + nan + b"\n\n" + request("m2") + b"\r\n" + request("m3")
    assert body_model_lines(content) == [
        (1, len(nan) + 3, None), (2, 0, None), (3, len(request("m2")) + 1, "m2"),
        (4, len(request("m3")), "m3")]


def test_a_line_is_given_only_when_read_whole_within_the_bound() -> None:
    content = request("a") + b"\n" + request("b") + b"\n"
    first = len(request("a")) + 1
    assert [line.model for line in lines_body_model(
        io.BytesIO(content), lines=100, max_bytes=first + 1)] == ["a"]
    # a line that reaches the bound is not read, as before
    assert list(lines_body_model(io.BytesIO(content), lines=100, max_bytes=first)) == []
    assert [line.number for line in lines_body_model(
        io.BytesIO(content * 3), lines=2, max_bytes=64 * MiB)] == [1, 2]


def test_a_long_model_value_is_named_by_its_first_characters() -> None:
    for padding in (b"", b" " * WHOLE_LINE_BYTES):
        line = request("m" * 5000).replace(b'"body":', b'"body":' + padding)
        [(_, _, model)] = body_model_lines(line)
        assert model == "m" * MODEL_LABEL_CHARS + "…"


class Counted(io.BytesIO):
    """A stream that counts what is read of it, and the largest single read."""

    def __init__(self, content: bytes) -> None:
        super().__init__(content)
        self.reads = 0
        self.largest = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.reads += len(data)
        self.largest = max(self.largest, len(data))
        return data


def huge_lines(size: int) -> dict[str, bytes]:
    """The issue's line, and two real requests: the model after a huge messages array,
    and the model first (whose whole line is still read, for a later duplicate)."""
    message = {"role": "user", "content": "word " * 2000}
    after = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
             "body": {"messages": [message] * (size // 10040), "model": "qwen3.8-27b"}}
    first = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
             "body": {"model": "qwen3.8-27b", "messages": [message] * (size // 10040)}}
    return {"issue": ("[" + "{}," * (size // 3 - 1) + "{}]\n").encode(),
            "model after": (json.dumps(after) + "\n").encode(),
            "model first": (json.dumps(first) + "\n").encode()}


@pytest.mark.parametrize("shape", ["issue", "model after", "model first"])
def test_a_24_mib_line_is_scanned_in_bounded_memory(shape: str) -> None:
    content = huge_lines(24 * MiB)[shape]
    stream = Counted(content)
    tracemalloc.start()
    try:
        found = list(lines_body_model(stream, lines=100, max_bytes=64 * MiB))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [line.model for line in found] == [None if shape == "issue" else "qwen3.8-27b"]
    assert found[0].size == len(content) - 1
    # every byte read once, a block at a time, and a few blocks' worth of memory where the
    # line decoded whole was about 25 times its size (~600 MB)
    assert stream.reads == len(content) and stream.largest <= BLOCK_BYTES
    assert peak < len(content) // 4, peak
