"""What goes into an engine and what comes out: plain dataclasses, no vLLM type.

The job pipeline builds rows from input lines, calls an engine once per chunk, and writes
each outcome into the result file (output-format.txt). One outcome per row, in row order,
always: a row the engine refuses carries a RowError and never takes its chunk down.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length"]

INVALID_REQUEST = "invalid_request_error"
# A row the engine's step failed on, in its batch and again alone (feed.py): its own error;
# the other rows of that batch were run again and answered.
ROW_FAILED_ENGINE = ("The model failed while generating this row, and again when the row "
                     "was run alone; the other rows were not affected.")


@dataclass(frozen=True)
class RowError:
    """output-format.txt's error object (type, message, code, param) plus the status the
    serving layer answered for the row (response.status_code; None: not reported)."""

    type: str
    message: str
    code: str | None = None
    param: str | None = None
    status_code: int | None = None

    @classmethod
    def invalid_request(cls, message: str, *, code: str | None = None,
                        param: str | None = None) -> RowError:
        """A row the model refuses: the reference's invalid_request_error, a 400."""
        return cls(type=INVALID_REQUEST, message=message, code=code, param=param,
                   status_code=400)

    @classmethod
    def engine_failed(cls, *, param: str | None = None) -> RowError:
        """The engine failed on this row alone (feed.py's RequestFailed): a 500 in its row;
        `param` names the part of the row it failed on, where it can tell (a decision's
        question)."""
        return cls(type="server_error", message=ROW_FAILED_ENGINE, code="engine_error",
                   param=param, status_code=500)


class RowRefused(Exception):
    """Raised while a row is prepared; the engine turns it into that row's RowError."""

    def __init__(self, error: RowError) -> None:
        super().__init__(error.message)
        self.error = error


# -- chat ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ChatRow:
    """One /v1/chat/completions row: its messages, its chat_template_kwargs (the row's own
    enable_thinking and reasoning_effort, the job-level values already filled in) and its
    response_format (the row's own, else the job's; None or {"type": "text"}: free text)."""

    messages: list[dict[str, Any]]
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    response_format: dict[str, Any] | None = None


@dataclass(frozen=True)
class ChatSettings:
    """The job-wide generation settings.

    max_tokens: the output cap, thinking included (the job's max_output_tokens).
    reasoning_budget: thinking tokens a row may spend before its trace is closed with the
    budget notice; None or 0: no cap (the reference's reasoning_budget 0). Applies to rows
    whose thinking is on only.
    temperature 0.0 is greedy: a batch result does not depend on the chunk it ran in.
    """

    max_tokens: int
    reasoning_budget: int | None = None
    temperature: float = 0.0
    seed: int | None = None


@dataclass(frozen=True)
class ChatOutcome:
    """content: the answer (choices[0].message.content); None when the row produced no
    answer (its thinking ran to the cap, or it failed). reasoning: the thinking trace
    (message.reasoning); None when thinking was off. finish_reason "length": the row stopped
    on the output cap. format_error: the row had a JSON response_format and its content is
    not valid JSON for it. prompt_tokens/completion_tokens: what the engine read and wrote,
    media included; reasoning_tokens is the part of completion_tokens spent thinking.
    media_tokens: the part of prompt_tokens the row's media took (its processor's
    placeholders), None where the engine does not tell them apart (a row is billed the
    catalog's media tokens either way: inference.kinds.metering). cached_tokens: the part of
    prompt_tokens the engine did not compute, found in its prefix cache (vLLM's
    num_cached_tokens); all of them on a copy of an identical row (TaskKind.serve)."""

    content: str | None
    reasoning: str | None
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    error: RowError | None = None
    format_error: bool = False
    media_tokens: int | None = None
    cached_tokens: int = 0

    @classmethod
    def failed(cls, error: RowError) -> ChatOutcome:
        return cls(content=None, reasoning=None, finish_reason="stop", prompt_tokens=0,
                   completion_tokens=0, reasoning_tokens=0, error=error)


# -- embeddings ----------------------------------------------------------------------------

@dataclass(frozen=True)
class EmbedRow:
    """One /v1/embeddings row: the text, verbatim, and the row's dimensions (None: native).
    A VL model's media row is its list of content parts as the customer sent them, each
    media part with its decoded media under inference.engines.media.DECODED_KEY; an engine
    serving a model for text refuses a list."""

    text: str | list[dict[str, Any]]
    dimensions: int | None = None


@dataclass(frozen=True)
class EmbedOutcome:
    """vector: unit length, `dimensions` wide; None with error on a refused row.
    media_tokens: as ChatOutcome's."""

    vector: list[float] | None
    prompt_tokens: int
    error: RowError | None = None
    media_tokens: int | None = None


# -- decisions -----------------------------------------------------------------------------

@dataclass(frozen=True)
class DecisionRow:
    """One /v1/systemone row: the state (a string, or an object read as its JSON), the
    named questions as the row carries them, and an optional language code."""

    state: str | dict[str, Any]
    questions: dict[str, Any]
    lang: str | None = None


@dataclass(frozen=True)
class DecisionOutcome:
    """answers: one entry per question, keyed by its name, in the reference's shape;
    input_tokens: what the row bills (0 when refused); routing: {"model", "reason"}."""

    answers: dict[str, dict[str, Any]] | None
    input_tokens: int
    routing: dict[str, str]
    error: RowError | None = None
