"""Which rows of a chunk are one request (issue 43 item 2): rows whose bodies are equal as
canonical JSON run once, and their copies are served from that run (TaskKind.serve; the
rule per kind is TaskKind.merge_key;
docs/dev/decisions/2026-12-06-identical-rows-and-cached-tokens.md).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from inference.kinds.base import InputRow


def body_digest(body: dict[str, Any]) -> bytes | None:
    """A request body's identity: the SHA-256 of its canonical JSON (keys sorted, no
    spaces), so two bodies that differ only in key order or spacing are one; None for a
    body JSON cannot write (never merged). A media part's URL stands for its bytes, as the
    reference's one fetch per URL while a job runs does (output-format.txt)."""
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return None
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def rows_merged(rows: Sequence[InputRow], key: Callable[[dict[str, Any]], bytes | None],
                ) -> tuple[list[int], dict[int, list[int]]]:
    """The rows that run (their positions, in order) and, by the position of each, the
    later rows that are copies of it (the same key; a None key is a row of its own)."""
    runs: list[int] = []
    copies: dict[int, list[int]] = {}
    first: dict[bytes, int] = {}
    for position, row in enumerate(rows):
        identity = key(row.body)
        if identity is None:
            runs.append(position)
        elif identity in first:
            copies.setdefault(first[identity], []).append(position)
        else:
            first[identity] = position
            runs.append(position)
    return runs, copies
