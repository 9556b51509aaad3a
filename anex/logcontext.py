"""What a log line is about, so one job's lines can be followed across processes
(docs/dev/decisions/2026-12-02-logs-that-follow-a-job.md).

Three context variables: the request id (anex.requestid, set by the web tier's middleware
and restored in a worker from the message that the request caused: anex.broker), and the
job and chunk a worker's actor is working on (set by the actors that take such an id,
jobs/tasks.py). JobLogFilter puts the last two on every record; JsonFormatter writes a
record as one JSON object a line, for ANEX_LOG_FORMAT=json.

Customer row text is kept out of the JSON lines' exceptions: an exception's message can
quote a row (a tokenizer refusing it, a parser echoing it), so only its class and the
stack's frames are written, never its message or its causes' messages. Our own messages
name ids and counts only.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from types import TracebackType

from anex.requestid import current_request_id

UNSET = "-"
current_job_id: ContextVar[str] = ContextVar("current_job_id", default=UNSET)
current_chunk_id: ContextVar[str] = ContextVar("current_chunk_id", default=UNSET)


@contextmanager
def log_context(*, job_id: object = None, chunk_id: object = None,
                request_id: str | None = None) -> Iterator[None]:
    """Every line logged inside names this job (and chunk, and request) unless given None,
    which keeps what the caller had."""
    tokens = []
    for var, value in ((current_job_id, job_id), (current_chunk_id, chunk_id),
                       (current_request_id, request_id)):
        if value is not None:
            tokens.append((var, var.set(str(value))))
    try:
        yield
    finally:
        for var, token in reversed(tokens):
            var.reset(token)


def log_context_clear() -> None:
    """Back to no request, job or chunk: a worker thread between two messages."""
    for var in (current_request_id, current_job_id, current_chunk_id):
        var.set(UNSET)


class JobLogFilter(logging.Filter):
    """Puts job_id and chunk_id on every record (UNSET when the line is about none)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.job_id = current_job_id.get()
        record.chunk_id = current_chunk_id.get()
        return True


def _exception_of(exc_info: tuple[type[BaseException], BaseException,
                                  TracebackType | None]) -> dict[str, object]:
    """The exception's class, its causes' classes and its frames, none of their messages."""
    kind, error, tb = exc_info
    causes: list[str] = []
    seen: BaseException | None = error.__cause__ or error.__context__
    while seen is not None and len(causes) < 10:
        causes.append(type(seen).__qualname__)
        seen = seen.__cause__ or seen.__context__
    frames = [f"{frame.filename}:{frame.lineno} in {frame.name}"
              for frame in traceback.extract_tb(tb)]
    return {"type": f"{kind.__module__}.{kind.__qualname__}", "causes": causes,
            "frames": frames}


def _or_null(value: object) -> object:
    return None if value in (None, UNSET) else value


class JsonFormatter(logging.Formatter):
    """One JSON object a line: time (UTC), level, logger, message, request_id, job_id,
    chunk_id (null when the line is about none), process, and an exception's class and
    frames (never its message)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "request_id": _or_null(getattr(record, "request_id", current_request_id.get())),
            "job_id": _or_null(getattr(record, "job_id", current_job_id.get())),
            "chunk_id": _or_null(getattr(record, "chunk_id", current_chunk_id.get())),
            "process": record.process,
        }
        if record.exc_info and record.exc_info[1] is not None:
            line["exception"] = _exception_of(record.exc_info)  # type: ignore[arg-type]
        return json.dumps(line, default=str, ensure_ascii=False)
