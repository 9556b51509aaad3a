"""JSONL lines as the product reads and writes them: orjson for speed, the standard library
for what orjson refuses (an integer wider than 64 bits in a customer's body).

One reader for a line wherever it is read: the line-by-line checks (jobs.validation.lines)
and the run (jobs.services.rows) both call line_loads, and the checks' fast lane
(inference.rows.fast, msgspec) refuses a block it would read otherwise, leaving it to the
line checks. All three take the last of duplicate keys, and refuse NaN and Infinity (not
JSON; orjson and msgspec refuse them, Python's json takes them) and a lone surrogate escape
such as "\\ud800" (not a character: no UTF-8 encodes it, and the tokenizer refuses it).
tests/unit/test_json_readers.py holds them to it.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not JSON")


# One decoder for every fallback (json.loads builds a new one per call).
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def line_loads(line: bytes | str) -> Any:
    """One JSONL line read with orjson; what orjson will not read falls back to the
    standard library, which takes an integer wider than 64 bits and nothing else orjson
    refuses. ValueError for a line that is not JSON (UnicodeDecodeError for non-UTF-8
    bytes); RecursionError for one nested thousands deep."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
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
