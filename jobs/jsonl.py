"""JSONL lines as the product reads and writes them: orjson for speed, the standard library
for what orjson refuses (an integer wider than 64 bits in a customer's body)."""

from __future__ import annotations

import json
from typing import Any

import orjson


def line_loads(line: bytes | str) -> Any:
    """One JSONL line read with orjson; what orjson will not read (an integer wider than 64
    bits, which Python's json takes) falls back to the standard library."""
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line)


def line_dumps(value: Any) -> bytes:
    """One JSONL line (newline included), compact, UTF-8, written with orjson."""
    try:
        return orjson.dumps(value, option=orjson.OPT_APPEND_NEWLINE)
    except TypeError:  # an integer wider than 64 bits from a customer's body
        return json.dumps(value, separators=(",", ":")).encode() + b"\n"
