"""Exceptions in the logs without their messages.

An exception raised while a customer's row is in hand (an engine refusing a prompt, a
tokenizer, a JSON reader) often quotes the row in its message, and `logger.exception`
writes that message and every chained one into the logs, which keep no customer data
(docs/dev/decisions/2026-12-02-row-text-out-of-the-logs.md). `exception_summary` keeps what an
operator needs to find the fault: each exception's class, chained causes included, and
where it was raised, frame by frame."""

from __future__ import annotations

import traceback
from pathlib import PurePath

# Frames kept per exception, innermost last: enough to find the fault, short in a log line.
FRAMES = 8


def exception_summary(error: BaseException) -> str:
    """`module.Class at file:line in function < …` for the error and each cause or context
    it chains to, never a message."""
    parts: list[str] = []
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = traceback.extract_tb(current.__traceback__)[-FRAMES:]
        where = " < ".join(f"{PurePath(frame.filename).name}:{frame.lineno} in {frame.name}"
                           for frame in reversed(frames))
        kind = type(current)
        parts.append(f"{kind.__module__}.{kind.__qualname__}" + (f" at {where}" if where else ""))
        current = current.__cause__ or (None if current.__suppress_context__
                                        else current.__context__)
    return "; from ".join(parts)
