"""Issue 22, C2: a JSONL line is read by three readers - the checks' fast lane (msgspec,
inference/rows/fast.py), the line-by-line checks and the run (orjson, jobs/jsonl.py) - and a
line they read differently could be counted as one request and run as another. Each case
below goes through all three: duplicate keys are read alike (the last one wins), and NaN,
Infinity and lone surrogates are refused alike."""

from __future__ import annotations

import io
from typing import Any

import pytest

from inference.kinds.chat import ChatKind
from inference.rows.core import InputRejected
from inference.rows.fast import ChatFastRows
from jobs.jsonl import line_loads
from jobs.validation import validate_jsonl
from tests.unit.test_validation_support import options, words

HEAD = b'{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":'
LAST = "one two three four five six seven"
DUPLICATES = {
    "a message's content": HEAD + b'{"messages":[{"role":"user","content":"short",'
                           b'"content":"' + LAST.encode() + b'"}]}}',
    "the messages": HEAD + b'{"messages":[{"role":"user","content":"short"}],'
                    b'"messages":[{"role":"user","content":"' + LAST.encode() + b'"}]}}',
    "the body": HEAD + b'{"messages":[{"role":"user","content":"short"}]},"body":'
                b'{"messages":[{"role":"user","content":"' + LAST.encode() + b'"}]}}',
}
REFUSED = {
    "a lone high surrogate": HEAD + b'{"messages":[{"role":"user","content":"x\\ud800"}]}}',
    "a lone low surrogate": HEAD + b'{"messages":[{"role":"user","content":"\\udc00x"}]}}',
    "a lone surrogate in a key": HEAD + b'{"messages":[{"role":"user","content":"x",'
                                 b'"\\ud800":1}]}}',
    "NaN": HEAD + b'{"messages":[{"role":"user","content":"x"}],"temperature":NaN}}',
    "Infinity": HEAD + b'{"messages":[{"role":"user","content":"x"}],"seed":Infinity}}',
    "-Infinity": HEAD + b'{"messages":[{"role":"user","content":"x"}],"seed":-Infinity}}',
}


def fast_lane(monkeypatch: pytest.MonkeyPatch, line: bytes) -> tuple[Any, list[Any]]:
    """The checks with the fast lane on: their verdict, and what the fast lane made of
    each block (None where it left the block to the line checks)."""
    prepared: list[Any] = []
    prepare = ChatFastRows.prepare

    def spied(self: ChatFastRows, chunk: bytes, lines: int) -> Any:
        prepared.append(prepare(self, chunk, lines))
        return prepared[-1]

    with monkeypatch.context() as patched:
        patched.setattr(ChatFastRows, "prepare", spied)
        return verdict(line), prepared


def line_lane(monkeypatch: pytest.MonkeyPatch, line: bytes) -> Any:
    with monkeypatch.context() as patched:
        patched.setattr(ChatKind, "fast_rows", lambda self, job: None)
        return verdict(line)


def verdict(line: bytes) -> Any:
    try:
        return validate_jsonl(io.BytesIO(line + b"\n"), options("gemma4-12b"),
                              count_tokens=words)
    except InputRejected as rejected:
        return ("refused", rejected.message)


@pytest.mark.parametrize("case", DUPLICATES)
def test_duplicate_keys_are_read_alike_by_all_three(monkeypatch: pytest.MonkeyPatch,
                                                    case: str) -> None:
    line = DUPLICATES[case]
    # the fast lane took the block, and counts the last value
    fast, prepared = fast_lane(monkeypatch, line)
    assert len(prepared) == 1 and prepared[0] is not None
    assert prepared[0].texts == [LAST]
    # the line checks count the same
    assert line_lane(monkeypatch, line) == fast
    assert fast.rows == 1
    assert fast.usage.input_tokens == line_lane(
        monkeypatch, HEAD + b'{"messages":[{"role":"user","content":"' + LAST.encode()
        + b'"}]}}').usage.input_tokens
    # and the run reads the very request that was counted
    assert line_loads(line)["body"]["messages"] == [{"role": "user", "content": LAST}]


@pytest.mark.parametrize("case", REFUSED)
def test_nan_infinity_and_lone_surrogates_are_refused_alike_by_all_three(
        monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    line = REFUSED[case]
    # the fast lane does not take the block
    fast, prepared = fast_lane(monkeypatch, line)
    assert prepared == [None]
    # the line checks refuse the line
    expected = ("refused", "Line 1: not valid JSON; each line must be one request object")
    assert fast == line_lane(monkeypatch, line) == expected
    # and so does the run's reader
    with pytest.raises(ValueError):
        line_loads(line)


def test_a_surrogate_pair_is_one_character_to_the_run() -> None:
    assert line_loads(b'{"c": "\\ud83d\\ude00"}') == {"c": "\U0001f600"}


@pytest.mark.parametrize("number", [2**70, -(2**63) - 1, 2**64, 10**19, -(10**30)])
def test_an_integer_outside_64_bits_is_read_exactly_by_the_run(number: int) -> None:
    # orjson 3.13 reads such an integer as a float (2**70 as 1.1805916207174113e+21)
    line = HEAD + b'{"messages":[{"role":"user","content":"x"}],"metadata":{"n":' \
        + str(number).encode() + b'}}}'
    for given in (line, line.decode()):
        value = line_loads(given)["body"]["metadata"]["n"]
        assert value == number and isinstance(value, int)


def test_a_long_number_beside_nan_is_still_refused_by_the_run() -> None:
    # a run of 19 digits sends the line to the standard library, which refuses NaN too
    with pytest.raises(ValueError):
        line_loads(HEAD + b'{"messages":[{"role":"user","content":"1234567890123456789"}],'
                   b'"temperature":NaN}}')
    assert line_loads(b'{"c": "1234567890123456789", "f": 0.12345678901234567890123}') == {
        "c": "1234567890123456789", "f": 0.12345678901234567890123}


def test_an_embeddings_long_fractions_are_read_by_orjson(monkeypatch: pytest.MonkeyPatch) -> None:
    # a fraction's digits are no integer: the result line of an embedding, whose values run
    # to 19 digits after the point, never takes the standard library's slower path
    import jobs.jsonl

    monkeypatch.setattr(jobs.jsonl, "_DECODER", None)
    line = b'{"embedding": [0.0038973277766809152, -0.0013879758908635362, -8.9e-09]}'
    assert line_loads(line) == {"embedding": [0.0038973277766809152, -0.0013879758908635362,
                                              -8.9e-09]}
