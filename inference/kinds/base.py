"""The task-kind interface: everything a row of one kind (chat, embed, decide) means, asked
of its kind instead of switched on the catalog's task string.

A kind answers for its rows at every stage of a job, and for the realtime API:

    submit      fields_problem        the job-level fields this kind takes (POST /jobs)
                needs_sample          whether the output length must be sampled
                input_formats         the input formats a job of this kind reads
    validate    row_cost              one JSONL row body checked and counted
                fast_rows             a block of plainly valid JSONL rows, checked at once
                parquet               how parquet rows are read (None: JSONL only)
                text_token_bound      the context a row's text is refused against unread
                takes_job_video_fps   whether a job-level video_fps reaches its rows
    estimate    estimate_usage        the file's counted usage plus what serving adds
                tokens_per_second     the conservative serving rate of the estimate
    engines     engine_build          the engine a checkpoint of this kind loads into
                engine                the process's engine for a model id, typed
                media_paths           where a row's media parts are (brought and decoded
                                      before the engine: inference.kinds.media)
                engine_request        the engine row one input row becomes
                engine_run            a chunk's engine rows through the engine (its feed)
                merge_key             which rows of a chunk are one request, run once
                copied                the outcome a copy of a row is served from
    results     served                the record one outcome becomes (body, usage)
                parquet_output        the result column a parquet result adds
    docs        pricing_section       its part of the /docs/pricing page

`serve` strings the engine steps together for a chunk. The kinds live in chat.py, embed.py
and decide.py; `inference.kinds.kind_for(model)` is the one place the task string is read.

The realtime API (realtime/) serves the kinds whose `realtime` is set, through the same
engines (engine_build, engine) and these, documented where they are defined:

    EmbedKind.realtime_request(model, value, *, dimensions=None) -> EmbedRequest
        one request's `input` (a string or a list of strings) checked against the realtime
        limits, turned into EmbedRows and counted (EmbedRequest.rows, .input_tokens)
    embed.embeddings_body(model_id, vectors, prompt_tokens) -> dict
        the embeddings list object, one vector per input
    DecideKind.realtime_request(model, body) -> DecisionRequest
        one decision body (state, questions, lang, model) checked by the batch row's rules,
        turned into its DecisionRow and counted (DecisionRequest.row, .input_tokens)
    decide.answer_body(model_id, outcome) -> dict
        the reference's decision response: answers, routing and usage

Both raise RequestRefused (past a limit, answered 400) or RequestMalformed (a body of the
wrong shape, 422), status-less refusals of anex.errors; `message` is the detail. A checked
request's `forward(model_id)` is the body the web tier sends the realtime engine server
(realtime/serving.py), where the kind reads it back (realtime_rows), runs a warm engine on
the rows of every request waiting (realtime_run) and answers each (realtime_reply).
"""

from __future__ import annotations

import dataclasses
import uuid
from abc import ABC, abstractmethod
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Generic, Protocol, TypeVar, cast

from anex.errors import Invalid, Malformed
from inference.constants import InputFormat, RowOutcome
from inference.engines.registry import EngineNotConfigured
from inference.kinds import engines
from inference.kinds.identical import body_digest, rows_merged
from inference.kinds.media import PartPath, media_windows
from inference.pricing import Usage

if TYPE_CHECKING:
    from pathlib import Path

    from inference.catalog import CatalogModel
    from inference.engines.registry import Engine
    from inference.engines.types import RowError
    from inference.kinds.metering import RowMeter
    from inference.rows.core import FastRows, FileReport, JobContext, JobOptions, RowCost, RowRef

RequestT = TypeVar("RequestT")  # what the engine takes for one row: ChatRow, EmbedRow, ...
OutcomeT = TypeVar("OutcomeT")  # what it answers for that row: ChatOutcome, EmbedOutcome, ...
EngineT = TypeVar("EngineT")  # what runs them, as the kind calls it: ChatRunner, ...

# The job-level fields that only make sense where text is generated (POST /jobs).
GENERATION_FIELDS = ("max_output_tokens", "reasoning", "reasoning_budget", "reasoning_effort",
                     "response_format", "video_fps")


class ServedJob(Protocol):
    """What a kind reads of the job whose rows it serves (jobs.models.Job): its id and
    model, and the job-level settings its rows fall back on."""

    @property
    def pk(self) -> uuid.UUID: ...
    @property
    def organization_id(self) -> uuid.UUID: ...
    @property
    def model(self) -> str: ...
    @property
    def max_output_tokens(self) -> int | None: ...
    @property
    def reasoning(self) -> bool | None: ...
    @property
    def reasoning_budget(self) -> int | None: ...
    @property
    def reasoning_effort(self) -> str: ...
    @property
    def response_format(self) -> dict[str, Any] | None: ...
    @property
    def dimensions(self) -> int | None: ...
    @property
    def video_fps(self) -> float | None: ...


def fields_refused(options: JobOptions, names: Sequence[str], why: str) -> str | None:
    """The reference's refusal of job-level fields a model does not take, or None when none
    of `names` is given; `why` names the model and what it returns instead."""
    refused = [name for name in names if options.given(name)]
    if not refused:
        return None
    # A body that said max_tokens is answered in its own words.
    shown = ["max_tokens" if name == "max_output_tokens" and options.max_tokens_alias else name
             for name in refused]
    verb = "is" if len(shown) == 1 else "are"
    return f"{', '.join(shown)} {verb} not accepted on {why}."


class RequestRefused(Invalid):
    """A realtime request that breaks the reference's rules, refused before anything is
    served or billed: a value past a limit or media in a text-only request (the API's 400);
    `message` is the detail."""

    @property
    def message(self) -> str:
        return self.detail


class RequestMalformed(Malformed, RequestRefused):
    """A realtime request body of the wrong shape (the API's 422, as everywhere in it)."""


def row_error_json(error: RowError) -> dict[str, Any]:
    """An engine's refusal of one row as output-format.txt's error object, with the status
    it was answered (the realtime engine server's wire form; unset fields left out)."""
    return {name: value for name, value in (
        ("type", error.type), ("message", error.message), ("code", error.code),
        ("param", error.param), ("status_code", error.status_code)) if value is not None}


@dataclass(frozen=True)
class InputRow:
    """One row of a job's input as a chunk reads it (jobs.services.rows)."""

    index: int
    ident: str  # custom_id (JSONL), the id column, or the row_index (parquet)
    body: dict[str, Any]  # the request body: messages/chat_template_kwargs/…, input, state…


@dataclass(frozen=True)
class ServedRow:
    """What one row's engine outcome becomes in the chunk's results: its outcome, the
    response body and error object (output-format.txt), the parquet result's output text,
    and what the row bills (nothing when it failed). An embedding row's vector is in its
    body, once."""

    outcome: RowOutcome
    status_code: int | None
    body: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    output: str | None = None
    usage: Usage = field(default_factory=Usage)

    @classmethod
    def failed(cls, error: RowError) -> ServedRow:
        """A row the engine refused: its error object, the status it was answered, unbilled."""
        return cls(outcome=RowOutcome.ERROR, status_code=error.status_code,
                   error={"message": error.message, "type": error.type, "code": error.code,
                          "param": error.param})


def _merged(served: ServedRow) -> ServedRow:
    """A copy's record, counted in its usage's merged_rows (reported, never priced)."""
    return dataclasses.replace(served, usage=served.usage + Usage(merged_rows=1))


class ParquetReading(ABC):
    """How a kind's rows come from a parquet input: which column holds a row's content,
    what that value costs (checked as its JSONL twin is), and the request body it stands
    for when the row is served. Parquet rows carry no per-row settings: the job's apply."""

    @abstractmethod
    def content_column(self, columns: Collection[str]) -> str:
        """The content column among the file's columns; InputRejected when it has none."""

    @abstractmethod
    def row_cost(self, column: str, value: Any, *, job: JobContext, row: RowRef) -> RowCost:
        """One row's value checked and counted; RowRejected naming the row."""

    @abstractmethod
    def body(self, column: str, value: Any) -> dict[str, Any]:
        """The request body the value stands for (as a JSONL row would carry it)."""


class TaskKind(ABC, Generic[RequestT, OutcomeT, EngineT]):
    """One kind of row. Kinds are stateless singletons (inference.kinds.kind_for)."""

    task: ClassVar[str]  # the catalog's task string (catalog.toml `task`)
    endpoint: ClassVar[str]  # the url every batch row of this kind targets
    noun: ClassVar[str]  # how messages name its models: "a chat model"
    # Rows generate text: the job carries an output cap, output tokens are billed, and an
    # omitted cap is estimated from a sample.
    generates: ClassVar[bool] = False
    # Rows of this kind are answered one request at a time by the realtime API too, on
    # the endpoint of the same name under /realtime/v1 (embeddings, systemone).
    realtime: ClassVar[bool] = False
    # The most rows one call of a realtime engine server's engine takes from the requests
    # waiting on it; more waiting than that runs in the next call.
    realtime_batch_rows: ClassVar[int] = 1
    input_formats: ClassVar[tuple[InputFormat, ...]] = (InputFormat.JSONL, InputFormat.PARQUET)
    parquet: ClassVar[ParquetReading | None] = None  # None: JSONL input only
    # The processing-time estimate's conservative rate (a chat job's sample measures its own).
    tokens_per_second: ClassVar[int]
    # What this kind calls an engine through (a runtime-checkable Protocol: EngineT), and
    # how a refusal names an engine of that kind.
    runner: ClassVar[type]
    runner_noun: ClassVar[str]

    # -- submit -----------------------------------------------------------------------------

    @abstractmethod
    def fields_problem(self, model: CatalogModel, options: JobOptions) -> str | None:
        """Why the job-level fields cannot go with this model (the submit's 422 detail),
        or None when they can."""

    def needs_sample(self, model: CatalogModel, options: JobOptions) -> bool:
        """Whether the estimate needs a sampled output length (options as requested)."""
        return False

    def parquet_refusal(self, model: CatalogModel) -> str:
        """The failure_reason of a parquet input on a kind that reads JSONL only."""
        return f"Model '{model.id}' takes JSONL input only."

    # -- validate ---------------------------------------------------------------------------

    @abstractmethod
    def row_cost(self, body: dict[str, object], *, job: JobContext, row: RowRef) -> RowCost:
        """One JSONL row's body checked against the model and the job, and counted;
        RowRejected (naming the row) at its first violation."""

    def fast_rows(self, job: JobContext) -> FastRows | None:
        """The JSONL checker's fast lane for this kind's rows (inference/rows/fast.py), or
        None: every line is then checked one at a time by row_cost."""
        return None

    def text_token_bound(self, model: CatalogModel) -> int | None:
        """The most tokens a row's text can be served in: text whose bytes alone show it
        cannot fit is refused untokenized. None: text is never refused for its length."""
        return max(model.context_tokens, model.media_context_tokens or 0)

    def takes_job_video_fps(self, model: CatalogModel) -> bool:
        """Whether a job-level video_fps sets the rate this model's clips are read at."""
        return False

    # -- estimate ---------------------------------------------------------------------------

    def estimate_usage(self, model: CatalogModel, report: FileReport, *,
                       max_output_tokens: int | None) -> Usage:
        """What the estimate prices: the rows as counted plus what serving them adds.
        InputRejected when the job cannot be served as asked."""
        return report.usage

    # -- engines ----------------------------------------------------------------------------

    @abstractmethod
    def engine_build(self, model: CatalogModel, checkpoint: Path) -> Engine:
        """The engine this model's checkpoint loads into (inference.engines.registry)."""

    def engine(self, model_id: str) -> EngineT:
        """The process's engine for this model id (inference.kinds.engines), as this kind
        calls it; EngineNotConfigured when the id is not served by such an engine."""
        engine = engines.engine_cached(model_id, self)
        if not isinstance(engine, self.runner):
            raise EngineNotConfigured(f"model '{model_id}' is not served by {self.runner_noun}")
        return cast(EngineT, engine)

    def media_paths(self, body: dict[str, Any]) -> list[PartPath]:
        """Where the body's media parts are (image_url, input_audio, audio_url, video_url
        content parts), in the order the row carries them; none by default."""
        return []

    @abstractmethod
    def engine_request(self, job: ServedJob, body: dict[str, Any]) -> RequestT:
        """The engine row one input row's body becomes under the job's settings."""

    @abstractmethod
    def engine_run(self, job: ServedJob, requests: list[RequestT]) -> list[OutcomeT]:
        """One call of the job's engine (`engine(job.model)`): one outcome per request, in
        order; a request the engine refuses fails alone (its outcome carries the error)."""

    @abstractmethod
    def served(self, job: ServedJob, row: InputRow, outcome: OutcomeT,
               meter: RowMeter) -> ServedRow:
        """The record one row's outcome becomes, and what it bills."""

    def merge_key(self, job: ServedJob, body: dict[str, Any]) -> bytes | None:
        """What makes rows of a chunk one request, run once (TaskKind.serve): a digest of
        the body as canonical JSON (keys sorted; custom_id is not in it), the job's settings
        being the same for every row. None: the row is never merged (a body JSON cannot
        write). Every row of a kind whose answer depends on nothing else merges; a kind
        whose rows may ask for sampling says which never do."""
        return body_digest(body)

    def copied(self, outcome: OutcomeT) -> OutcomeT:
        """The outcome a copy of a row is served from: the row's own, by default."""
        return outcome

    def serve(self, job: ServedJob, rows: Sequence[InputRow],
              meter: RowMeter) -> list[ServedRow]:
        """A chunk's rows through the job's engine: in one call, or for rows carrying media
        one call per window of their decoded media (inference.kinds.media), each window's
        media dropped once the engine has answered it. A row whose media could not be
        brought or decoded fails alone, unbilled, and never reaches the engine.

        Rows of the chunk that are one request (merge_key) run once, the first of them: its
        copies are neither fetched, decoded nor run. Each copy is served from the first
        row's outcome (`copied`) as its own row, its own line and custom_id, and billed
        as every row is (docs/dev/decisions/2026-12-06-identical-rows-and-cached-tokens.md);
        a copy of a row that failed fails with its error. Its usage counts it in
        merged_rows."""
        served: list[ServedRow | None] = [None] * len(rows)
        runs, copies = rows_merged(rows, lambda body: self.merge_key(job, body))
        unique = [rows[position] for position in runs]
        for window in media_windows(job, unique, paths=self.media_paths,
                                    context=meter.context):
            ready = []
            for at, resolved in window:
                position = runs[at]
                if resolved.error is not None:
                    served[position] = ServedRow.failed(resolved.error)
                    for copy in copies.get(position, ()):
                        served[copy] = _merged(ServedRow.failed(resolved.error))
                else:
                    ready.append((position, self.engine_request(job, resolved.body)))
            del window  # the engine requests hold the decoded media now, and only they
            if ready:
                outcomes = self.engine_run(job, [request for _, request in ready])
                for (position, _), outcome in zip(ready, outcomes, strict=True):
                    served[position] = self.served(job, rows[position], outcome, meter)
                    for copy in copies.get(position, ()):
                        served[copy] = _merged(self.served(job, rows[copy],
                                                           self.copied(outcome), meter))
            del ready
        assert all(row is not None for row in served)  # every window's rows were answered
        return cast(list[ServedRow], served)

    # -- results ----------------------------------------------------------------------------

    def parquet_output(self, records: list[dict[str, Any]]) -> tuple[str, Any]:
        """The column a parquet result adds for these rows' records: (name, pyarrow array).
        A generated or decided row's output is its text."""
        import pyarrow as pa

        return "output", pa.array([item["output"] for item in records], pa.string())

    # -- the realtime engine server (kinds whose `realtime` is set) --------------------------

    def realtime_rows(self, body: dict[str, Any]) -> list[RequestT]:
        """The engine rows of one request as the web tier forwards it to a realtime engine
        server (its `forward` body); ValueError when the body is not one."""
        raise NotImplementedError(f"{self.task} rows are not served in realtime")

    def realtime_run(self, engine: Engine, rows: list[RequestT]) -> list[dict[str, Any]]:
        """One call of a warm engine for the rows of every request waiting on it: per row,
        its outcome as the server answers it (JSON-ready, in order)."""
        raise NotImplementedError(f"{self.task} rows are not served in realtime")

    def realtime_reply(self, results: list[dict[str, Any]]) -> dict[str, Any]:
        """The engine server's answer to one request, from its rows' results."""
        raise NotImplementedError(f"{self.task} rows are not served in realtime")

    # -- docs -------------------------------------------------------------------------------

    @abstractmethod
    def pricing_section(self, models: list[CatalogModel]) -> list[str]:
        """The /docs/pricing section for these models of this kind (markdown lines)."""
