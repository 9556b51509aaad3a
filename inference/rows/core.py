"""The row checks' shared vocabulary: the job's options, a rejection, the per-job state that
every row is checked against, what one row costs, and the report a file adds up to (the
file readers that add it up are jobs/validation)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Protocol

from inference.catalog import CatalogLimits, CatalogModel, catalog_limits, model_get
from inference.chat_template import ChatPrompt
from inference.pricing import Usage
from inference.token_pieces import PieceCounts

CHAT = "/v1/chat/completions"
EMBEDDINGS = "/v1/embeddings"
DECISIONS = "/v1/systemone"
ENDPOINTS = (CHAT, EMBEDDINGS, DECISIONS)

# The reference: the HEAD probe "covers the first few dozen URLs in a job".
PROBE_LIMIT = 32
# A customer's custom_id can be any length; the failure_reason quotes at most this much.
LABEL_MAX_CHARS = 200
ZERO = Decimal(0)

# One row's text may take at most this many bytes of its line (JSONL) or value (parquet);
# inline media get room on top (line_max_bytes). Read before anything is decoded, so a
# 2 GiB line with no newline is refused after 16 MiB, not held whole in memory.
TEXT_MAX_BYTES = 16 * 1024 * 1024
# The inline media one row may carry on top of its text, by modality: the reference's
# "at most 4 images and 1 video clip" a row, and one audio clip.
INLINE_ITEMS_PER_ROW = {"image": 4, "audio": 1, "video": 1}
# No tokenizer we serve has a token longer than this many UTF-8 bytes (tiny-qwen3's
# longest is 42, MiniLM's 18; Qwen's byte-level BPE, built on cl100k, stays under it), so a
# string longer than context x MAX_TOKEN_BYTES cannot fit and is refused without being
# tokenized (16 MiB of text takes a tokenizer 13 s and 2 GB; tests/db/test_validation_limits.py
# holds the local tokenizers to this bound).
MAX_TOKEN_BYTES = 128

CountTokens = Callable[[str], int]
# What is counted: a text, or a chat prompt (scaffolding and content, inference.tokens).
Counted = str | ChatPrompt
# Rows whose text is counted together, in one call into the tokenizer (encode_batch_fast).
COUNT_BATCH_ROWS = 1024
ProbeContentType = Callable[[str], str | None]


def line_max_bytes(model: CatalogModel, limits: CatalogLimits) -> int:
    """The longest line (or parquet value) a row on `model` may take: its text plus, base64
    encoded, the inline media it may carry in the modalities the model reads."""
    media = sum(limits.inline_max_bytes(modality) * count
                for modality, count in INLINE_ITEMS_PER_ROW.items()
                if modality in model.modalities)
    return TEXT_MAX_BYTES + (media + 2) // 3 * 4


# The job-level fields that reach rows, by their names in POST /jobs (JobOptions' fields).
OPTION_FIELDS = ("max_output_tokens", "reasoning", "reasoning_budget", "reasoning_effort",
                 "response_format", "dimensions", "video_fps")


@dataclass(frozen=True)
class JobOptions:
    """A job's model and the job-level fields of POST /jobs, as requested and already
    shape-checked: the one value of them. The API's serializer and the console's form build
    it (jobs.serializers.JobCreateIn.options, console.forms.JobSubmitForm.options), a job
    stores it (jobs.models.Job.options_columns) and gives it back (Job.options()), a
    preflight check keeps it (to_json), and the kinds and the row checks take it.

    `model` is the id as given: admission (jobs.services.submission) decides whether it is
    one the caller may use; the row checks read its catalog entry (`catalog_model`)."""

    model: str
    max_output_tokens: int | None = None
    reasoning: bool | None = None
    reasoning_budget: int | None = None
    reasoning_effort: str | None = None
    response_format: dict[str, object] | None = None
    dimensions: int | None = None
    video_fps: float | None = None
    # The body said max_tokens, the former name of max_output_tokens: refusals and the job
    # answer in its own words.
    max_tokens_alias: bool = False
    # Every row's body.model must name the job's model (an OpenAI batch's rows name it; the
    # anex API's rows leave it to the job and it is not read).
    row_model: bool = False

    def given(self, name: str) -> bool:
        return getattr(self, name) is not None

    def catalog_model(self) -> CatalogModel:
        """The model's catalog entry; only an admitted model (or a job's) is asked for."""
        model = model_get(self.model)
        if model is None:
            raise LookupError(f"model {self.model!r} is not in the catalog")
        return model

    def to_json(self) -> dict[str, object]:
        """The fields that reach rows, as a preflight check stores them (not the model,
        which the check keeps in a column of its own)."""
        return {name: getattr(self, name) for name in OPTION_FIELDS}

    @classmethod
    def from_json(cls, model: str, data: Mapping[str, object]) -> JobOptions:
        return cls(model=model, **{name: data.get(name) for name in OPTION_FIELDS})  # type: ignore[arg-type]


class InputRejected(Exception):
    """The input fails the job with failure_code invalid_input; `message` is the
    failure_reason. Raised as is for a file-wide fault (no rows at all, no usable column).
    `code` names the rule where OpenAI's batch validation has a code for it
    (invalid_json_line, duplicate_custom_id, url_mismatch, model_mismatch, empty_file)."""

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


class TextTooLong(Exception):
    """A string whose byte length alone shows it cannot fit the model's context, raised by
    JobContext.count_tokens before the tokenizer sees it; the row loop names the row."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"{size} bytes")
        self.size = size
        self.limit = limit

    def reject(self, row: RowRef, model: CatalogModel) -> RowRejected:
        return row.reject_sentence(
            f"is too long: it carries {thousands(self.size)} bytes of text, more than the "
            f"{thousands(self.limit)}-token maximum that model '{model.id}' can serve could "
            "hold. Shorten or split this row.")


class RowRejected(InputRejected):
    """A row (or line) breaks a rule; the message names it: "Row 'clip-7': ...".
    `limit`: the rule is one of the reference's size limits, not the row's shape (a
    realtime request answers the one 400 and the other 422)."""

    def __init__(self, message: str, *, row: str, limit: bool = False,
                 code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.row = row
        self.limit = limit


@dataclass(frozen=True, slots=True)
class RowRef:
    """How a failure names its row: by custom_id (or parquet id) when it has one, else by
    its line number (JSONL) or row_index (parquet)."""

    label: str

    @classmethod
    def named(cls, name: str) -> RowRef:
        if len(name) > LABEL_MAX_CHARS:
            name = name[:LABEL_MAX_CHARS] + "..."
        return cls(f"Row '{name}'")

    @classmethod
    def line(cls, number: int) -> RowRef:
        return cls(f"Line {number}")

    @classmethod
    def index(cls, row_index: int) -> RowRef:
        return cls(f"Row {row_index} (row_index)")

    def reject(self, detail: str, *, limit: bool = False,
               code: str | None = None) -> RowRejected:
        return RowRejected(f"{self.label}: {detail}", row=self.label, limit=limit, code=code)

    def reject_sentence(self, rest: str, *, limit: bool = False) -> RowRejected:
        """For messages that continue the label itself: "Row 'x' is too long: ..."."""
        return RowRejected(f"{self.label} {rest}", row=self.label, limit=limit)


@dataclass(slots=True)
class RowCost:
    """What one valid row consumes, in the terms of inference.pricing.Usage plus the facts
    the estimator needs. `media_row` puts an embedding row carrying any image or video on
    the media-row rate, text included; chat and decision rows never set it and keep media
    apart in media_tokens."""

    text_tokens: int
    media_tokens: int = 0
    images: int = 0
    clips: int = 0
    media_seconds: Decimal = ZERO
    media_row: bool = False
    estimated_clips: int = 0
    context_limit: int | None = None  # the row's own input budget (chat): output headroom
    thinking: bool = False
    effort: str | None = None
    own_response_format: bool = False
    questions: int = 0
    # Text-only rows checked by a file validator: texts whose tokens join text_tokens when
    # the next batch is counted (CountBatch), and only then is the row's fit checked.
    uncounted: list[Counted] | None = None

    @property
    def input_tokens(self) -> int:
        return self.text_tokens + self.media_tokens


@dataclass(frozen=True)
class FileReport:
    """A validated input: its row count, endpoint and exact usage, plus what the estimator
    and pricer read later.

    usage              inference.pricing.Usage as its docstring defines it (chat: text in
                       input_tokens, media in media_tokens; embeddings: a row's tokens in
                       input_tokens or media_row_tokens by what it carries; decisions: the
                       text counted once per question, in input_tokens). No output tokens:
                       those are estimated later.
    max_input_tokens   the largest row's input tokens, media included
    output_headroom    chat: the least context any row leaves for output (its input budget
                       less its input); None for embeddings and decisions
    thinking_rows      chat rows whose thinking is on (own setting, else the job's, else
                       the model's default)
    effort_rows        of those, how many think at each effort level
    response_format_rows   rows carrying their own response_format
    media_rows         rows carrying any image, audio or video
    estimated_clips    clips whose length came from their size or the model's ceiling,
                       not declared or read from the clip itself
    probed_urls        HEAD probes made (at most PROBE_LIMIT)
    questions          decisions: questions over all rows
    """

    rows: int
    endpoint: str
    usage: Usage
    max_input_tokens: int = 0
    output_headroom: int | None = None
    thinking_rows: int = 0
    effort_rows: Mapping[str, int] = field(default_factory=dict)
    response_format_rows: int = 0
    media_rows: int = 0
    estimated_clips: int = 0
    probed_urls: int = 0
    questions: int = 0


class CountPlan(Protocol):
    """A batch's count in steps (JobContext.count_plan)."""

    def encode(self) -> list[int]: ...

    def finish(self, counts: list[int]) -> list[int]: ...


class _WholeCount:
    """A counter without steps: all of it in `encode`."""

    def __init__(self, count: Callable[[list[Counted]], list[int]],
                 texts: list[Counted]) -> None:
        self._count, self._texts = count, texts

    def encode(self) -> list[int]:
        return self._count(self._texts)

    def finish(self, counts: list[int]) -> list[int]:
        return counts


class RowKind(Protocol):
    """What the checks ask of a row's task kind (inference.kinds.TaskKind), which the
    caller hands in: the checks sit below the kinds, which call them."""

    def text_token_bound(self, model: CatalogModel) -> int | None: ...

    def takes_job_video_fps(self, model: CatalogModel) -> bool: ...


class JobContext:
    """Per-job state every row is checked against: the model, the job's options, the token
    counter, the effective video sampling rate, and the HEAD-probe budget. One per file,
    never shared between jobs."""

    def __init__(self, options: JobOptions, count_tokens: CountTokens,
                 probe_content_type: ProbeContentType | None, kind: RowKind) -> None:
        self.options = options
        self.model = options.catalog_model()
        self.kind = kind
        self.limits: CatalogLimits = catalog_limits()
        self.line_max_bytes = line_max_bytes(self.model, self.limits)
        self._raw_count = count_tokens
        # The tokenizer's batch count and the chat engine's prompt, where the counter has
        # them (inference.tokens.ModelTokens); a plain callable counts one string at a time.
        self._count_batch: Callable[[list[Counted]], list[int]] | None = getattr(
            count_tokens, "count_batch", None)
        # This file's own piecewise counter, where the tokenizer's counts can be taken so
        # (inference.token_pieces): a repeated system prompt is tokenized once per file.
        counting = getattr(count_tokens, "counting", None)
        self._pieces: PieceCounts | None = counting() if counting is not None else None
        # A checkpoint's tokenizer counts in Rust without the GIL: the next block can be
        # checked and rendered meanwhile (validate_jsonl, count_plan).
        self.counts_apart = counting is not None
        if self._pieces is not None:
            self._count_batch = self._pieces.count_batch
        self._chat_prompt: Callable[[list[dict[str, object]], dict[str, object]],
                                    ChatPrompt | None] | None = getattr(
            count_tokens, "chat_prompt", None)
        # Set by the file validators, which count text-only rows a batch at a time; a
        # lone request (realtime) is counted as it is checked.
        self.deferring = False
        # Whether a chat row is counted as its rendered prompt (the checkpoint's template).
        self.renders_chat = self._chat_prompt is not None and getattr(
            count_tokens, "template", None) is not None
        self._context_max = self.kind.text_token_bound(self.model)
        # A string of at most this many characters cannot be too long for any context
        # (4 UTF-8 bytes a character at most): length_check need not be asked.
        self.unmeasured_chars = self._context_max * MAX_TOKEN_BYTES // 4 \
            if self._context_max is not None else 1 << 62
        self._probe = probe_content_type
        self._probed: dict[str, str | None] = {}
        media = self.model.media
        # Embedding models always sample at 1 fps and gemma4-12b takes no rate: a
        # job-level video_fps counts only where the model's kind takes one.
        self.takes_video_fps = self.kind.takes_job_video_fps(self.model)
        if self.takes_video_fps and options.video_fps is not None:
            self.video_fps = Decimal(str(options.video_fps))
            self.video_fps_wording = "requested"
        else:
            self.video_fps = Decimal(media.video_fps_default or 1)
            self.video_fps_wording = "default" if media.video_fps_max is not None else "fixed"

    def count_tokens(self, text: str) -> int:
        """The model's token count of text; TextTooLong, untokenized, for a string too many
        bytes long for any context of the model to hold."""
        self.length_check(text)
        return self._raw_count(text)

    def count_batch(self, texts: list[Counted]) -> list[int]:
        """Each text's count (already length-checked), in one tokenizer call where the
        counter can (a chat prompt comes only from a counter that renders them, and
        counts them too)."""
        if self._count_batch is not None:
            return self._count_batch(texts)
        return [self._raw_count(text if isinstance(text, str) else text.text)
                for text in texts]

    def count_plan(self, texts: list[Counted]) -> CountPlan:
        """count_batch in steps: `encode()` may run on another thread (it touches no
        Python state of this job), `finish(encoded)` back on this one gives the counts."""
        if self._pieces is not None:
            return self._pieces.plan(texts)
        return _WholeCount(self.count_batch, texts)

    def chat_prompt(self, messages: list[dict[str, object]],
                    kwargs: dict[str, object]) -> ChatPrompt | None:
        """The prompt the chat engine will serve for these messages under these template
        kwargs, by the engine's own function (inference.tokens); None without the
        checkpoint's template, or where the template refuses the messages (the engine then
        refuses the row alone when it is served)."""
        if self._chat_prompt is None:
            return None
        try:
            return self._chat_prompt(messages, kwargs)
        except Exception:  # the template's own refusal (raise_exception) or a shape it cannot read
            return None

    def length_check(self, text: str) -> None:
        """TextTooLong for a string whose byte length alone shows it cannot fit; a string
        far shorter than the bound is let through without being measured."""
        if self._context_max is not None:
            bound = self._context_max * MAX_TOKEN_BYTES
            # A character is 1 to 4 UTF-8 bytes: only a long string is encoded to measure.
            if len(text) * 4 > bound:
                size = len(text.encode("utf-8", "surrogatepass"))
                if size > bound:
                    raise TextTooLong(size, self._context_max)

    @property
    def probed_urls(self) -> int:
        return len(self._probed)

    def content_type(self, url: str) -> tuple[bool, str | None]:
        """The Content-Type a HEAD request got for url: (asked, answer). Only the first
        PROBE_LIMIT distinct URLs are asked; a repeat reuses its answer."""
        if url in self._probed:
            return True, self._probed[url]
        if self._probe is None or len(self._probed) >= PROBE_LIMIT:
            return False, None
        answer = self._probe(url)
        self._probed[url] = answer
        return True, answer


def fit_check(total: int, limit: int, carried: list[str], *, job: JobContext,
              row: RowRef) -> None:
    """A row's input tokens against its context (the reference's "Models": input tokens
    including what the media encodes to, and input plus output when the job caps output);
    `carried` names the media modalities that chose the limit."""
    model = job.model
    if total > limit:
        serving = f" with {listing(carried)} input" if carried else ""
        including = " (including media)" if carried else ""
        raise row.reject_sentence(
            f"is too long: {thousands(total)} input tokens{including} exceeds the "
            f"{thousands(limit)}-token maximum that model '{model.id}' can serve{serving}. "
            "Shorten or split this row.")
    reserved = job.options.max_output_tokens
    if reserved and total + reserved > limit:
        # The reference: input and output together have to fit the context as well.
        raise row.reject_sentence(
            f"is too long: {thousands(total)} input tokens and the job's max_output_tokens "
            f"of {thousands(reserved)} come to {thousands(total + reserved)}, over the "
            f"{thousands(limit)}-token context of model '{model.id}'. Shorten or split this "
            "row, or lower max_output_tokens.")


@dataclass(slots=True)
class BlockCost:
    """What a block of valid text-only rows consumes, as a kind's fast lane adds it up
    (inference/rows/fast.py): the sums Tally keeps, over the block at once."""

    identities: list[str]  # the rows' custom_ids, in file order
    input_tokens: int
    max_input_tokens: int
    context_limit: int  # every row's: the least headroom is this less max_input_tokens
    thinking_rows: int = 0
    effort_rows: Counter[str] = field(default_factory=Counter)
    response_format_rows: int = 0

    @property
    def rows(self) -> int:
        return len(self.identities)


class PreparedRows(Protocol):
    """A block a fast lane has checked and not yet counted."""

    texts: list[Counted]

    def cost(self, counts: list[int]) -> BlockCost | None:
        """The block's sums given each text's count; None when a row does not fit."""


class FastRows(Protocol):
    """A kind's fast lane for JSONL rows (TaskKind.fast_rows)."""

    def prepare(self, chunk: bytes, lines: int) -> PreparedRows | None:
        """`lines` whole lines checked, when every one is a plainly valid row of the job,
        with the texts to count; None for anything else (the block is then checked line
        by line). Changes nothing: it may run while an earlier block is counted."""


def thousands(number: int) -> str:
    return f"{number:,}"


def listing(items: tuple[str, ...] | list[str], last: str = "and") -> str:
    """'a', 'a and b', 'a, b and c': how the messages list things."""
    if len(items) < 2:
        return "".join(items)
    return f"{', '.join(items[:-1])} {last} {items[-1]}"
