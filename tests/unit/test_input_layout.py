"""Issue 42 item 2: the checks' one read of a JSONL input records where its rows lie
(jobs.validation.layout): the chunk ends are the ones a read of the lines gives, for every
chunk size and however the blocks fall, and the sample is a uniform sample of the rows,
each with the bytes of its row. One rule for which lines are rows (jobs.jsonl.line_row)."""

from __future__ import annotations

import io
import json
import random
from collections import Counter

import pytest

from jobs.jsonl import input_rows, line_loads, line_row, range_rows
from jobs.validation import validate_jsonl
from jobs.validation.layout import InputLayout, RowLayout
from tests.unit.test_validation_support import chat_line, options, words

MODEL = "qwen3.8-27b"


def request(index: int, size: int = 1) -> bytes:
    return json.dumps(chat_line(f"r{index}", "word " * size)).encode()


def read_plan(data: bytes, size: int) -> list[int]:
    """The chunk ends a read of the lines gives (the start's plan for a job without a
    recorded one): after every size-th row, and the file's end after a last short chunk."""
    ends, rows = [], 0
    for _start, end, _line in input_rows(io.BytesIO(data)):
        rows += 1
        if rows % size == 0:
            ends.append(end)
    return [*ends, len(data)] if rows % size else ends


def laid_out(data: bytes, size: int, *, sample: int = 64,
             rng: random.Random | None = None) -> tuple[int, InputLayout | None]:
    layout = RowLayout(chunk_rows=size, sample_rows=sample, rng=rng)
    report = validate_jsonl(io.BytesIO(data), options(MODEL), count_tokens=words,
                            layout=layout)
    return report.rows, layout.finish(report.rows)


# Rows of mixed lengths, some long enough that a block ends inside them (the checks read
# 32 KiB first, growing to 256 KiB); the file's ends as customers write them.
ROWS = [request(index, 1 + (index * 7919) % 40 + (9000 if index % 97 == 5 else 0))
        for index in range(700)]
FILES = {
    "plain": b"\n".join(ROWS) + b"\n",
    "no final newline": b"\n".join(ROWS),
    "crlf, a bom, blank lines ending it": b"\xef\xbb\xbf" + b"\r\n".join(ROWS)
    + b"\r\n\r\n  \n\t\n",
    "one row": ROWS[0] + b"\n\n",
}


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 256, 5000])
def test_the_recorded_chunks_are_the_ones_a_read_gives(name: str, size: int) -> None:
    data = FILES[name]
    rows, layout = laid_out(data, size)
    assert layout is not None and layout.chunk_rows == size
    assert layout.chunk_ends == read_plan(data, size)
    assert len(layout.chunk_ends) == -(-rows // size)
    # and each chunk's range holds its rows, as the run reads them
    start = 0
    for index, end in enumerate(layout.chunk_ends):
        held = range_rows(data[start:end], first=start == 0)
        assert [line_loads(line)["custom_id"] for line in held] == \
            [f"r{row}" for row in range(index * size, min(rows, (index + 1) * size))]
        start = end


@pytest.mark.parametrize("name", FILES)
def test_each_sampled_row_is_the_row_its_bytes_hold(name: str) -> None:
    data = FILES[name]
    rows, layout = laid_out(data, 256)
    assert layout is not None
    picks = layout.picks
    assert len(picks) == min(64, rows) and picks == sorted(picks)
    assert len({index for index, _, _ in picks}) == len(picks)
    for index, start, end in picks:
        row = line_row(data[start:end], first=start == 0)
        assert line_loads(row)["custom_id"] == f"r{index}"


def test_a_small_file_is_sampled_whole() -> None:
    _rows, layout = laid_out(b"\n".join(ROWS[:5]) + b"\n", 256)
    assert layout is not None and [index for index, _, _ in layout.picks] == [0, 1, 2, 3, 4]


def test_the_sample_is_uniform_over_the_rows() -> None:
    # Every row equally likely, across blocks: 300 samples of 64 from 2,000 rows (about
    # 190 kB, several blocks), counted by tenths of the file; each tenth expects 1,920.
    data = b"\n".join(request(index, 20) for index in range(2000)) + b"\n"
    rng = random.Random(42)
    tenths: Counter[int] = Counter()
    first_or_last = 0
    for _ in range(300):
        _rows, layout = laid_out(data, 256, rng=rng)
        assert layout is not None and len(layout.picks) == 64
        indices = [index for index, _, _ in layout.picks]
        tenths.update(index // 200 for index in indices)
        first_or_last += (0 in indices) + (1999 in indices)
    assert all(1920 - 250 < tenths[tenth] < 1920 + 250 for tenth in range(10)), tenths
    assert 0 < first_or_last  # the ends of the file are sampled too (expected 19)


def test_no_layout_where_the_blocks_cannot_be_placed() -> None:
    # A row after blank lines (the checks refuse the file; its layout is never asked for)...
    layout = RowLayout(chunk_rows=2, sample_rows=4)
    layout.block(1, 2, ROWS[0] + b"\n\n")
    layout.block(3, 1, ROWS[1] + b"\n")
    assert layout.finish(1) is None and layout.finish(2) is None
    # ...a line read past unkept (a preflight check's over-long line)...
    layout = RowLayout(chunk_rows=2, sample_rows=4)
    layout.block(1, 1, None)
    assert layout.finish(0) is None
    # ...or a count of rows that is not the checks'.
    layout = RowLayout(chunk_rows=2, sample_rows=4)
    layout.block(1, 3, b"\n".join(ROWS[:3]) + b"\n")
    assert layout.finish(2) is None and layout.finish(3) is not None


def test_a_blank_line_is_no_row_in_one_place() -> None:
    assert line_row(b"  \t\r\n") == b""
    assert line_row(b"\xef\xbb\xbf\n", first=True) == b""
    assert line_row(b'\xef\xbb\xbf {"a": 1}\r\n', first=True) == b'{"a": 1}'
    assert line_row(b'\xef\xbb\xbf{"a": 1}\n') == b'\xef\xbb\xbf{"a": 1}'  # not the first
    # A range splits at newlines only: a \r between a row's tokens is JSON whitespace.
    assert range_rows(b'{"a":\r1}\n\n{"b": 2}\r\n') == [b'{"a":\r1}', b'{"b": 2}']
    assert [(start, end) for start, end, _ in input_rows(io.BytesIO(b'\n{"a": 1}\n \n{}'))] \
        == [(1, 10), (12, 14)]
