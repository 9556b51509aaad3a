"""Issue 43 item 1: the estimate's read keys every row (jobs.validation.grouping) and plans
rows that share work together: a shared prefix's rows consecutive, identical rows side by
side, rows that share nothing in file order, and a file with too little shared planned
contiguously, exactly as before. The keys are the ones a row read alone gives, however the
checks' blocks fall."""

from __future__ import annotations

import io
import itertools
import json
import random

import numpy as np
import pytest

from jobs.jsonl import input_rows, line_row
from jobs.validation import validate_jsonl
from jobs.validation.grouping import (
    LEVEL_BASE,
    ShareKeys,
    grouped,
    order_bytes,
    plan_arrays,
    starts_bytes,
)
from jobs.validation.layout import InputLayout, RowLayout
from tests.unit.test_validation_support import options, words

MODEL = "qwen3.8-27b"
SYSTEM = "You answer questions about the document you are given, briefly."


def chat(custom_id: str, *messages: str, **body: object) -> bytes:
    roles = ["system", "user", "assistant", "user"]
    return json.dumps({"custom_id": custom_id, "method": "POST",
                       "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": roles[at], "content": text}
                                             for at, text in enumerate(messages)], **body}}
                      ).encode()


def document(number: int, words_: int = 300) -> str:
    return " ".join(f"doc{number}-w{k}" for k in range(words_))


def documents_file(seed: int = 7, documents: int = 20, questions: int = 5,
                   ) -> tuple[bytes, list[int]]:
    """`documents` documents asked `questions` questions each, interleaved at random; and
    each row's document."""
    rng = random.Random(seed)
    pairs = [(d, q) for d in range(documents) for q in range(questions)]
    rng.shuffle(pairs)
    rows = [chat(f"r{i}", SYSTEM, f"{document(d)}\n\nQuestion {q}: what does it say?")
            for i, (d, q) in enumerate(pairs)]
    return b"\n".join(rows) + b"\n", [d for d, _ in pairs]


def laid_out(data: bytes, *, prefixes: bool = True, size: int = 16,
             model: str = MODEL) -> InputLayout:
    layout = RowLayout(chunk_rows=size, sample_rows=4, keys=ShareKeys(prefixes=prefixes))
    report = validate_jsonl(io.BytesIO(data), options(model), count_tokens=words,
                            layout=layout)
    laid = layout.finish(report.rows)
    assert laid is not None
    return laid


def test_a_documents_questions_are_planned_together_where_the_first_appears() -> None:
    data, docs = documents_file()
    plan = laid_out(data).grouped
    assert plan is not None and plan.order is not None
    planned = [docs[i] for i in plan.order.tolist()]
    # each document's five rows are consecutive, in the file order of its rows
    runs = [planned[at:at + 5] for at in range(0, 100, 5)]
    assert all(len(set(run)) == 1 for run in runs)
    assert len({run[0] for run in runs}) == 20
    for run_start in range(0, 100, 5):
        rows = plan.order[run_start:run_start + 5].tolist()
        assert rows == sorted(rows)
    # the groups come in the order their first rows appear in the file
    firsts = [plan.order[at] for at in range(0, 100, 5)]
    assert firsts == sorted(firsts)
    # 4 of each 5 rows hold the document before them: most of the prompt bytes
    assert plan.shared_prefix_share is not None and 0.4 < plan.shared_prefix_share < 0.8
    assert plan.identical_rows == 0


def test_the_starts_name_every_rows_bytes() -> None:
    data, _ = documents_file()
    data = b"\xef\xbb\xbf" + data.replace(b"\n", b"\r\n") + b"\r\n \n"
    plan = laid_out(data).grouped
    assert plan is not None
    read = [(start, end) for start, end, _line in input_rows(io.BytesIO(data))]
    starts = plan.starts.tolist()
    assert starts[:-1] == [start for start, _ in read] and starts[-1] == len(data)
    for index, (start, end) in enumerate(itertools.pairwise(starts)):
        assert line_row(data[start:end], first=start == 0) == \
            line_row(data[read[index][0]:read[index][1]], first=index == 0)


@pytest.mark.parametrize("size", [1, 3, 64])
def test_the_keys_are_the_same_however_the_blocks_fall(size: int) -> None:
    # given rows long enough that the checks' first blocks (32 KiB) end inside them
    data, _ = documents_file(documents=40)
    whole = laid_out(data).grouped
    keys = ShareKeys(prefixes=True)
    position = 0
    lines = data.split(b"\n")[:-1]
    for first in range(0, len(lines), size):
        block = b"".join(line + b"\n" for line in lines[first:first + size])
        ends = np.cumsum([len(line) + 1 for line in lines[first:first + size]])
        keys.block(block, np.concatenate(([0], ends[:-1])) + position, first=first == 0)
        position += len(block)
    alone = keys.finish(rows=len(lines), end=position)
    assert whole is not None and alone is not None and whole.order is not None
    assert alone.order is not None and alone.order.tolist() == whole.order.tolist()
    assert alone.starts.tolist() == whole.starts.tolist()


def test_identical_rows_are_side_by_side_and_counted() -> None:
    # given short embedding rows, some repeated but for their custom_id
    texts = [f"text {i}" for i in range(60)]
    picks = [7, 30, 7, 12, 30, 7]
    rows = [json.dumps({"custom_id": f"e{i}", "method": "POST", "url": "/v1/embeddings",
                        "body": {"input": text}}).encode()
            for i, text in enumerate([*texts, *(texts[p] for p in picks)])]
    plan = laid_out(b"\n".join(rows) + b"\n", prefixes=False,
                    model="qwen3-embedding-8b").grouped
    assert plan is not None and plan.order is not None
    order = plan.order.tolist()
    # each repeat right behind the first row it repeats, the rest in file order
    assert order[:8] == [0, 1, 2, 3, 4, 5, 6, 7]
    assert order[8:12] == [60, 62, 65, 8]
    assert order[order.index(12):order.index(12) + 2] == [12, 63]
    assert order[order.index(30):order.index(30) + 3] == [30, 61, 64]
    assert sorted(order) == list(range(66))
    assert plan.identical_rows == 6
    assert plan.shared_prefix_share is None  # embedding rows have no prompt prefix


def test_a_file_sharing_nothing_plans_contiguously() -> None:
    rows = [chat(f"r{i}", SYSTEM, document(i, 60 + i)) for i in range(50)]
    plan = laid_out(b"\n".join(rows) + b"\n").grouped
    assert plan is not None
    assert plan.order is None  # contiguous: the plan is chunk_ends, as before grouping
    assert plan.identical_rows == 0


def test_a_prompt_every_row_shares_leaves_the_order_as_it_is() -> None:
    # given a long system prompt every row shares, then its own question: every row is in
    # one group, whose order is the file's, so nothing moves and the plan is contiguous
    long_system = SYSTEM + " " + document(999, 200)
    rows = [chat(f"r{i}", long_system, f"question {i} " * 40) for i in range(50)]
    plan = laid_out(b"\n".join(rows) + b"\n").grouped
    assert plan is not None and plan.order is None
    # each row holds the shared system prompt of the row before it
    assert plan.shared_prefix_share is not None and plan.shared_prefix_share > 0.5


def test_too_little_shared_plans_contiguously() -> None:
    # given 100 rows of which two share a document (2 %, under the 5 % a plan groups at)
    rows = [chat(f"r{i}", SYSTEM, document(i)) for i in range(100)]
    rows[90] = chat("r90", SYSTEM, document(3) + " and one more question")
    plan = laid_out(b"\n".join(rows) + b"\n").grouped
    assert plan is not None and plan.order is None


def test_rows_sharing_nothing_keep_their_places_around_the_groups() -> None:
    wholes = np.array([10, 11, 12, 10, 13, 11, 10], np.uint64)
    plan = grouped(wholes=wholes, levels=None, sizes=None,
                   starts=np.arange(8, dtype=np.uint64))
    assert plan.order is not None and plan.order.tolist() == [0, 3, 6, 1, 5, 2, 4]
    assert plan.identical_rows == 3


def test_a_line_the_keys_cannot_read_leaves_the_plan_contiguous() -> None:
    keys = ShareKeys(prefixes=True)
    keys.block(b'{"url": "/v1/chat/completions", "body": {"messages": []}}\n'
               b'{"body": }\n', np.array([0, 57]), first=True)
    assert keys.lost and keys.finish(rows=2, end=68) is None


def test_more_rows_than_keys_are_kept_for_plan_contiguously() -> None:
    data, _ = documents_file()
    layout = RowLayout(chunk_rows=16, sample_rows=4,
                       keys=ShareKeys(prefixes=True, max_rows=50))
    report = validate_jsonl(io.BytesIO(data), options(MODEL), count_tokens=words,
                            layout=layout)
    laid = layout.finish(report.rows)
    assert laid is not None and laid.grouped is None
    assert len(laid.chunk_ends) == 7  # the layout itself is whole


def test_prefix_levels_are_only_the_lengths_a_prompt_reaches() -> None:
    keys = ShareKeys(prefixes=True)
    short = chat("a", "x" * 10)
    long = chat("b", "y" * (LEVEL_BASE * 5))
    data = short + b"\n" + long + b"\n"
    keys.block(data, np.array([0, len(short) + 1]), first=True)
    levels = keys._levels[0]
    assert not levels[0].any()  # under 256 bytes: no level
    assert np.count_nonzero(levels[1]) == 3  # 256, 512 and 1024 of its ~1,300 bytes


def test_the_plan_is_kept_as_little_endian_bytes() -> None:
    order = np.array([3, 0, 2, 1], np.uint32)
    starts = np.array([0, 10, 25, 40, 2**40], np.uint64)
    back_order, back_starts = plan_arrays(order_bytes(order), starts_bytes(starts))
    assert back_order.tolist() == [3, 0, 2, 1]
    assert back_starts.tolist() == [0, 10, 25, 40, 2**40]
    assert len(order_bytes(order)) == 16 and len(starts_bytes(starts)) == 40


def test_a_prompt_every_row_shares_counts_for_no_group() -> None:
    # given one long system prompt every row holds, and 2 of 100 rows sharing more
    long_system = SYSTEM + " " + document(999, 200)
    rows = [chat(f"r{i}", long_system, f"{i} " + document(i)) for i in range(100)]
    rows[70] = chat("r70", long_system, "3 " + document(3) + " and again")
    plan = laid_out(b"\n".join(rows) + b"\n").grouped
    # then too few rows share work the order could help: the plan is contiguous
    assert plan is not None and plan.order is None
