"""JSONL lines as the product reads and writes them: orjson for speed, the standard library
for what orjson cannot read exactly (an integer wider than 64 bits in a customer's body,
which orjson 3.13 reads as a float, losing its digits) or refuses.

One reader for a line wherever it is read: the line-by-line checks (jobs.validation.lines)
and the run (jobs.services.rows) both call line_loads, and the checks' fast lane
(inference.rows.fast, msgspec) refuses a block it would read otherwise, leaving it to the
line checks. All three take the last of duplicate keys, and refuse NaN and Infinity (not
JSON; orjson and msgspec refuse them, Python's json takes them) and a lone surrogate escape
such as "\\ud800" (not a character: no UTF-8 encodes it, and the tokenizer refuses it).
tests/unit/test_json_readers.py holds them to it. An OpenAI batch's create finds its model
by a scan of each long line's body.model that never decodes it (jobs.jsonl_scan); on every
valid line it reads what line_loads reads (tests/unit/test_jsonl_scan.py).

And one rule for which lines are rows: a JSONL input's rows are its lines split at b"\n",
and a blank line (nothing but ASCII whitespace) is no row (line_row). The checks, the
estimate's layout of the rows (jobs.validation.layout), the run's reads and a re-run's
(jobs.services.rows, jobs.services.rerun) all read lines through it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

import orjson

BOM = b"\xef\xbb\xbf"
# What a blank line is made of, and what is stripped around a row: ASCII whitespace (what
# bytes.strip() removes; a request line ending in \r\n loses its \r).
SPACE = b" \t\n\r\x0b\x0c"


def line_row(line: bytes, *, first: bool = False) -> bytes:
    """The request a line of a JSONL input holds: the line without the whitespace around it
    (its newline among it) and, on the file's first line, without the UTF-8 byte order mark.
    Empty for a blank line, which is no row."""
    text = line.strip(SPACE)
    if first and text.startswith(BOM):
        text = text[len(BOM):].strip(SPACE)
    return text


def range_rows(data: bytes, *, first: bool = False) -> list[bytes]:
    """The rows of a byte range of whole lines of a JSONL input (`first`: the range starts
    the file), each as line_row gives it."""
    return [row for at, line in enumerate(data.split(b"\n"))
            if (row := line_row(line, first=first and at == 0))]


def input_rows(stream: IO[bytes]) -> Iterator[tuple[int, int, bytes]]:
    """Each row of a JSONL input read from its first byte: its byte range [start, end) in
    the file (its newline included) and its line as the file has it."""
    position = 0
    for number, line in enumerate(stream):
        start, position = position, position + len(line)
        if line_row(line, first=number == 0):
            yield start, position, line


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# One decoder for every fallback (json.loads builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constants)
# orjson reads an integer outside 64 bits (below -2**63, above 2**64 - 1) as a float rather
# than refusing it: 2**70 comes back 1.1805916207174113e+21. Such an integer is a run of 19
# digits or more that no "." comes right before (a fraction's digits, as in an embedding's
# 0.0038973277766809152, are read exactly by orjson), so a line holding such a run is read
# by the standard library, which reads every integer exactly. (A long run inside a string
# takes that path too: read the same, only slower.) The run is found by mapping every digit
# to "0", "." to itself and the rest to " " (bytes.translate: about 0.3 us for a 400-byte
# line that orjson reads in 2 us; a regular expression took 10 us).
_MAPPED = bytes(48 if 48 <= byte <= 57 else 46 if byte == 46 else 32 for byte in range(256))
_MAPPED_TEXT = str.maketrans(bytes(range(128)).decode(), _MAPPED[:128].decode())
_LONG_RUN, _LONG_RUN_TEXT = b" " + b"0" * 19, " " + "0" * 19


def _long_integer_maybe(line: bytes | str) -> bool:
    if isinstance(line, bytes):
        return _LONG_RUN in line.translate(_MAPPED)
    return _LONG_RUN_TEXT in line.translate(_MAPPED_TEXT)


def line_loads(line: bytes | str) -> Any:
    """One JSONL line read with orjson; a line that may hold an integer wider than 64 bits,
    or that orjson refuses, is read by the standard library, which reads such an integer
    exactly and refuses everything else orjson refuses. ValueError for a line that is not
    JSON (UnicodeDecodeError for non-UTF-8 bytes); RecursionError for one nested thousands
    deep."""
    if not _long_integer_maybe(line):
        try:
            return orjson.loads(line)
        except orjson.JSONDecodeError:
            pass
    value = _DECODER.decode(line.decode("utf-8") if isinstance(line, bytes) else line)
    # orjson refuses lone surrogates; the standard decoder makes them into a str that
    # cannot be encoded (UnicodeEncodeError, a ValueError).
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return value


def line_dumps(value: Any) -> bytes:
    """One JSONL line (newline included), compact, UTF-8, written with orjson."""
    try:
        return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # an integer wider than 64 bits from a customer's body
        return json.dumps(value, separators=(",", ":")).encode() + b"\n"
