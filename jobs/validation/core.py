"""What a file reader adds up over a file's rows, beside the row checks themselves
(inference/rows): the job's context with its whole kind, the text-only rows waiting for
their batch count, the running sums, and a preflight check's collected failures."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from inference.kinds import AnyKind, kind_for
from inference.pricing import Usage
from inference.rows.core import (
    COUNT_BATCH_ROWS,
    ZERO,
    BlockCost,
    CountTokens,
    FileReport,
    InputRejected,
    JobContext,
    JobOptions,
    ProbeContentType,
    RowCost,
    RowRef,
    RowRejected,
    fit_check,
)


class FileContext(JobContext):
    """A file reader's JobContext: it holds the model's whole task kind, which reads each
    row (JobContext itself knows only what the row checks ask of a kind)."""

    kind: AnyKind

    def __init__(self, options: JobOptions, count_tokens: CountTokens,
                 probe_content_type: ProbeContentType | None) -> None:
        super().__init__(options, count_tokens, probe_content_type,
                         kind_for(options.catalog_model()))


@dataclass(frozen=True, slots=True)
class RowError:
    """One failing row, as a preflight check reports it: where it is (the JSONL line
    number, or a parquet row's row_index), its custom_id (or id) when it has one, and the
    reason a job would fail with. A fault of the whole file has neither."""

    reason: str
    line: int | None = None
    custom_id: str | None = None
    row_index: int | None = None
    code: str | None = None  # the rule's code, where it has one (InputRejected.code)

    def as_json(self) -> dict[str, object]:
        out: dict[str, object] = {"line": self.line, "custom_id": self.custom_id,
                                  "reason": self.reason}
        if self.row_index is not None:
            out["row_index"] = self.row_index
        return out


class RowErrors:
    """The validator's collect-all mode (a preflight check): given to validate_jsonl or
    validate_parquet, a failing row is recorded here and the read goes on, where a job's
    estimate stops at the first. The first `limit` are kept; every one is counted."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: list[RowError] = []
        self.count = 0
        self.failed_rows = 0  # of count, those that are rows (not a blank line, a file fault)

    def add(self, error: RowError, *, row: bool = True) -> None:
        self.count += 1
        self.failed_rows += row
        if len(self.items) < self.limit:
            self.items.append(error)


class CountBatch:
    """The file validators' text-only rows, counted COUNT_BATCH_ROWS at a time: a row
    whose cost still has uncounted text waits here, and joins the tally once its batch is
    counted and its fit checked. Rows leave in file order, so the first failing row is the
    one reported; `flush` before reporting any later row's failure."""

    def __init__(self, job: JobContext, tally: Tally) -> None:
        self.job = job
        self.tally = tally
        self.pending: list[tuple[RowRef, RowCost, object]] = []

    def add(self, row: RowRef, cost: RowCost, where: object = None) -> None:
        """`where` comes back with the row's rejection (flush's on_reject)."""
        if cost.uncounted is None:
            self.tally.add(cost)
            return
        self.pending.append((row, cost, where))
        if len(self.pending) >= COUNT_BATCH_ROWS:
            self.flush()

    def flush(self, on_reject: Callable[[RowRejected, object], None] | None = None) -> None:
        """Count the waiting rows and add them up. A row that does not fit raises its
        RowRejected, or, given on_reject (collect mode), is handed to it and left out."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        texts = [text for _, cost, _ in pending for text in cost.uncounted or ()]
        counts = iter(self.job.count_batch(texts))
        limit = self.job.model.context_tokens  # text only: the model's own context
        for row, cost, where in pending:
            cost.text_tokens += sum(next(counts) for _ in cost.uncounted or ())
            cost.uncounted = None
            try:
                fit_check(cost.input_tokens, limit, [], job=self.job, row=row)
            except RowRejected as rejected:
                if on_reject is None:
                    raise  # the read stops here: the rows after it are not added
                on_reject(rejected, where)
                continue
            self.tally.add(cost)


class Tally:
    """The running sums over valid rows: plain integers, nothing kept per row."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.rows = 0
        self.input_tokens = 0
        self.media_tokens = 0
        self.media_row_tokens = 0
        self.images = 0
        self.clips = 0
        self.media_seconds = ZERO
        self.max_input_tokens = 0
        self.output_headroom: int | None = None
        self.thinking_rows = 0
        self.effort_rows: Counter[str] = Counter()
        self.response_format_rows = 0
        self.media_rows = 0
        self.estimated_clips = 0
        self.questions = 0

    def add(self, cost: RowCost) -> None:
        self.rows += 1
        total = cost.input_tokens
        if cost.media_row:
            self.media_row_tokens += total
        else:
            self.input_tokens += cost.text_tokens
            self.media_tokens += cost.media_tokens
        if total > self.max_input_tokens:
            self.max_input_tokens = total
        if cost.context_limit is not None:
            headroom = cost.context_limit - total
            if self.output_headroom is None or headroom < self.output_headroom:
                self.output_headroom = headroom
        if cost.images or cost.clips:
            self.media_rows += 1
            self.images += cost.images
            self.clips += cost.clips
            self.media_seconds += cost.media_seconds
            self.estimated_clips += cost.estimated_clips
        if cost.thinking:
            self.thinking_rows += 1
            if cost.effort is not None:
                self.effort_rows[cost.effort] += 1
        self.response_format_rows += cost.own_response_format
        self.questions += cost.questions

    def add_block(self, block: BlockCost) -> None:
        self.rows += block.rows
        self.input_tokens += block.input_tokens
        self.max_input_tokens = max(self.max_input_tokens, block.max_input_tokens)
        headroom = block.context_limit - block.max_input_tokens
        if self.output_headroom is None or headroom < self.output_headroom:
            self.output_headroom = headroom
        self.thinking_rows += block.thinking_rows
        self.effort_rows.update(block.effort_rows)
        self.response_format_rows += block.response_format_rows

    def report(self, job: JobContext, *, errors: RowErrors | None = None) -> FileReport:
        # In collect mode a file whose every row failed reports those rows, not "no rows".
        if not self.rows and not (errors is not None and errors.failed_rows):
            raise InputRejected("The input file has no rows: a job needs at least one "
                                "request.", code="empty_file")
        usage = Usage(input_tokens=self.input_tokens, media_tokens=self.media_tokens,
                      media_row_tokens=self.media_row_tokens, images=self.images,
                      clips=self.clips, media_seconds=self.media_seconds)
        return FileReport(
            rows=self.rows, endpoint=self.endpoint, usage=usage,
            max_input_tokens=self.max_input_tokens, output_headroom=self.output_headroom,
            thinking_rows=self.thinking_rows, effort_rows=dict(self.effort_rows),
            response_format_rows=self.response_format_rows, media_rows=self.media_rows,
            estimated_clips=self.estimated_clips, probed_urls=job.probed_urls,
            questions=self.questions,
        )
